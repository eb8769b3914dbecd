"""Rank 0's progress posted to Kubeflow Trainer's status server (gpt/training/trainer_status.py),
against the test cluster's model of that server (tests/support/cluster/statusserver.py: its
routes, bearer-token check and decoding as kubeflow/trainer v2.3.0's) on a local port, in this
process. The run on the test cluster, its TrainJob's status.trainerStatus written through the
API server, is tests/runtimes/test_train_gpt_nodes.py's.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cluster.certs import TokenIssuer
from support.cluster.render import token_audience
from support.cluster.statusserver import StatusServer as ServerModel
from support.cluster.statusserver import refused_port, silent_port

from gpt.training.trainer_status import (
    ENV_CA_CERT,
    ENV_TOKEN,
    ENV_URL,
    MAX_TEXT,
    StatusReporter,
    StatusServer,
    metric_value,
    status_request,
)

NS, JOB = "team-a", "train-gpt-1a2b3c4d"


def until(condition, what: str, timeout: float = 30) -> None:
    """Wait for `condition` (the poster's thread works on its own); fail naming `what`."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture
def server(issuer):
    """The status server model; `server.applied` is what it applied to the TrainJob."""
    applied: list[dict] = []
    model = ServerModel(issuer, lambda ns, name, status: applied.append(status["trainerStatus"]))
    model.applied = applied
    yield model
    model.stop()


def pod_files(folder: Path, server: ServerModel, issuer: TokenIssuer) -> StatusServer:
    """The CA and token files a pod of TrainJob NS/JOB gets, and where it posts."""
    (folder / "ca.crt").write_bytes(server.cert.ca_pem)
    write_token(folder / "token", issuer.issue(token_audience(NS, JOB), 3600, NS, POD))
    return StatusServer(server.url(NS, JOB), folder / "ca.crt", folder / "token")


POD = {"name": f"{JOB}-node-0-0-x7k2p", "uid": "9f0e"}


def write_token(path: Path, token: str) -> None:
    """As the kubelet rotates a projected token: a new file in its place."""
    path.with_suffix(".new").write_text(token)
    path.with_suffix(".new").replace(path)


def test_nothing_without_all_three_variables(monkeypatch):
    env = {ENV_URL: "https://s:10443/x", ENV_CA_CERT: "/ca.crt", ENV_TOKEN: "/token"}
    assert StatusServer.from_env(env) == StatusServer("https://s:10443/x", Path("/ca.crt"),
                                                      Path("/token"))  # fmt: skip
    for name in env:
        assert StatusServer.from_env({k: v for k, v in env.items() if k != name}) is None
    for name in env:
        monkeypatch.delenv(name, raising=False)
    assert StatusReporter.from_env(print) is None


def test_the_request_keeps_to_the_crd():
    observed = datetime(2026, 11, 28, 12, 30, 5, 123456, tzinfo=UTC)
    request = status_request(250, 3e12, {"loss": 3.21987654, "tokens_per_s": 1234567.89,
                                         "step": 120, "lr": 6e-5}, observed)  # fmt: skip
    assert request == {"trainerStatus": {
        "progressPercentage": 100, "estimatedRemainingSeconds": 2**31 - 1,
        "lastUpdatedTime": "2026-11-28T12:30:05Z",
        "metrics": [{"name": "loss", "value": "3.21988"},
                    {"name": "tokens_per_s", "value": "1234568"},
                    {"name": "step", "value": "120"}, {"name": "lr", "value": "6e-05"}],
    }}  # fmt: skip
    assert status_request(-3, None, {}, observed) == {"trainerStatus": {
        "progressPercentage": 0, "lastUpdatedTime": "2026-11-28T12:30:05Z"}}  # fmt: skip
    for value in (1e300, -1e300, float("nan"), float("inf"), 2**200, 1e-300):
        assert 1 <= len(metric_value(value)) <= MAX_TEXT, value
    many = {f"m{i}": float(i) for i in range(300)}
    assert len(status_request(5, 1, many, observed)["trainerStatus"]["metrics"]) == 256


def test_progress_reaches_the_trainjob_and_a_newer_status_replaces_one_not_yet_posted(
    tmp_path, server, issuer
):
    lines: list[str] = []
    reporter = StatusReporter(pod_files(tmp_path, server, issuer), lines.append,
                              min_interval_s=3600)  # fmt: skip
    reporter.report(0.125, 61.4, {"step": 1, "loss": 10.25, "tokens_per_s": 5000.0})
    until(lambda: len(server.applied) == 1, "the first status applied")
    first = server.applied[0]
    assert first["progressPercentage"] == 12 and first["estimatedRemainingSeconds"] == 61
    assert first["metrics"] == [{"name": "step", "value": "1"}, {"name": "loss", "value": "10.25"},
                                {"name": "tokens_per_s", "value": "5000"}]  # fmt: skip
    assert datetime.strptime(first["lastUpdatedTime"], "%Y-%m-%dT%H:%M:%SZ")
    for step in range(2, 8):  # within the interval: held, each replacing the one before
        reporter.report(step / 8, 10.0, {"step": step, "loss": 5.0})
    reporter.report(1.0, 0.0, {"step": 8, "loss": 4.5, "val_loss": 4.75})
    time.sleep(0.2)
    assert len(server.applied) == 1, "a status was posted within the interval"
    reporter.finish({"val_loss": 4.5, "val_bpb": 1.75}, wait_s=60)  # not waiting its turn
    assert len(server.applied) == 2
    final = server.applied[1]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert {m["name"]: m["value"] for m in final["metrics"]} == {
        "step": "8", "loss": "4.5", "tokens_per_s": "5000", "val_loss": "4.5", "val_bpb": "1.75"}
    assert lines == []
    assert [code for code, _ in server.requests] == [200, 200]


def test_whole_percent_done_and_below_100_until_the_end(tmp_path, server, issuer):
    reporter = StatusReporter(pod_files(tmp_path, server, issuer), print, min_interval_s=0)
    reporter.report(29 / 100, 1.0, {"step": 29})
    until(lambda: len(server.applied) == 1, "the first status applied")
    reporter.report(1.0, 0.0, {"step": 8})  # the last iteration; export and report to come
    until(lambda: len(server.applied) == 2, "the second status applied")
    assert [s["progressPercentage"] for s in server.applied] == [29, 99]


def test_the_token_is_read_again_before_each_post(tmp_path, server, issuer):
    lines: list[str] = []
    files = pod_files(tmp_path, server, issuer)
    reporter = StatusReporter(files, lines.append, min_interval_s=0)
    reporter.report(0.1, 5, {"step": 1})
    until(lambda: len(server.requests) == 1, "the first post")
    # Rotated to a token of another TrainJob's audience: refused, said once.
    write_token(files.token, issuer.issue(token_audience(NS, "other"), 3600, NS, POD))
    for step in (2, 3):
        reporter.report(step / 10, 5, {"step": step})
        until(lambda n=step: len(server.requests) == n, f"post {step}")
    # Rotated again, to this TrainJob's: taken.
    write_token(files.token, issuer.issue(token_audience(NS, JOB), 3600, NS, POD))
    reporter.report(0.4, 5, {"step": 4})
    until(lambda: len(server.requests) == 4, "post 4")
    assert [code for code, _ in server.requests] == [200, 403, 403, 200]
    assert [s["metrics"][0]["value"] for s in server.applied] == ["1", "4"]
    assert len(lines) == 1 and "HTTP 403: Forbidden" in lines[0], lines


@pytest.fixture
def black_hole():
    """A server that accepts connections and never answers."""
    with silent_port() as port:
        yield port


@pytest.mark.parametrize("dead", ["refused", "silent"])
def test_a_dead_server_never_holds_training_and_is_said_once(tmp_path, server, issuer, dead,
                                                            black_hole):  # fmt: skip
    files = pod_files(tmp_path, server, issuer)
    port = refused_port() if dead == "refused" else black_hole
    files = StatusServer(f"https://127.0.0.1:{port}/status", files.ca_cert, files.token)
    lines: list[str] = []
    # Each post would wait a minute on the silent server: training must not.
    reporter = StatusReporter(files, lines.append, min_interval_s=0, timeout_s=60)
    start = time.monotonic()
    for step in range(1, 200):
        reporter.report(step / 200, 5, {"step": step})
    reporter.finish(wait_s=0.5)
    # Bounds, not speed: a thousandth of what one post may take, with room for a busy machine.
    assert time.monotonic() - start < 0.5 + 5
    if dead == "refused":
        until(lambda: lines, "the warning")
        time.sleep(0.3)  # posts go on meanwhile
        assert len(lines) == 1 and "ConnectionRefusedError" in lines[0], lines
    else:
        assert lines == []  # still waiting for its first answer
