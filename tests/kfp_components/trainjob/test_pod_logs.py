"""Pod logs as a cluster keeps them: the kubelet's rotation, a plain read against a followed one,
and what the step makes of them (progress while the TrainJob runs, a restart said, the stage's
files carried whole and bounded through a log of more than 10 MiB)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time

import pytest
from support.cluster.kubelet import Kubelet, LogRotation
from support.cluster.render import Rendered
from support.trainjobs import TRAIN_FILES, stand_in

from components.step.artifacts import (
    LOSS_PNG,
    REPORT_MD,
    TRAIN_JSONL,
    train_metrics,
    train_report_html,
)
from components.trainjob import launcher
from components.trainjob.launcher import GROUP, PLURAL, VERSION
from components.trainjob.podlogs import LogDirPodLogs
from components.trainjob.stagelog import (
    CARRY_MAX_BYTES,
    CARRY_MAX_RECORDS,
    CarriedFiles,
    carry,
    files_from_log,
    thin,
)

# Numbered lines in bursts, with pauses in which the kubelet's monitor finds the log big.
BURSTS = (
    "import sys, time\n"
    "for burst in range({bursts}):\n"
    "    for i in range(100):\n"
    "        print(f'line {{burst * 100 + i:06d}} ' + 'x' * 40)\n"
    "    sys.stdout.flush(); time.sleep({pause})\n"
)


def plan(program: str) -> Rendered:
    container = {"name": "node", "command": ["python3", "-c", program], "env": []}
    return Rendered(name="j", namespace="ns", num_nodes=1, container=container,
                    pod_spec={"containers": [container]}, backoff_limit=0,
                    max_restarts=None, jobset={})  # fmt: skip


def wait_exit(pod) -> None:
    pod.proc.wait(30)
    pod.container_log.join(10)


def numbered(lines) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("line ")]


def test_the_kubelet_defaults_are_upstreams_and_so_are_its_limits():
    # kubernetes pkg/kubelet/apis/config/v1beta1/defaults.go: "10Mi", 5 files.
    assert (LogRotation().max_size, LogRotation().max_files) == (10 * 1024 * 1024, 5)
    # A kubelet refuses to look more often than every 3 s, or to keep fewer than 2 files.
    with pytest.raises(ValueError, match="containerLogMonitorInterval 2.9s"):
        LogRotation(monitor_interval_s=2.9)
    with pytest.raises(ValueError, match="containerLogMaxFiles 1"):
        LogRotation(max_files=1)


@pytest.mark.process
def test_a_running_containers_log_is_rotated_and_a_plain_read_returns_the_current_file(tmp_path):
    # 10 s of output, 5 KB every 0.1 s: rotated at each of three monitor rounds, 3 s apart.
    rotation = LogRotation(max_size=8 * 1024, max_files=3)
    kubelet = Kubelet(tmp_path / "pods", {}, {}, rotation)
    pod = kubelet.start(plan(BURSTS.format(bursts=100, pause=0.1)), 0, 0, 0)
    followed = []
    follower = threading.Thread(
        target=lambda: followed.extend(LogDirPodLogs(tmp_path / "pods").follow("ns", pod.name))
    )
    follower.start()
    wait_exit(pod)
    follower.join(10)
    files = sorted(p.name for p in pod.folder.glob("node.log*"))
    rotated = [f for f in files if f != "node.log"]
    # rotateLatestLog's `<log>.<YYYYmmdd-HHMMSS>`, the older ones gzipped, at most max_files.
    assert rotated and len(files) <= rotation.max_files, files
    (newest,) = [f for f in rotated if not f.endswith(".gz")]
    assert re.fullmatch(r"node\.log\.\d{8}-\d{6}", newest)
    assert all(f.removesuffix(".gz") <= newest for f in rotated), files
    plain = numbered(LogDirPodLogs(tmp_path / "pods").log("ns", pod.name, None).splitlines())
    # pods/log is the current file only: the end of the log (empty if just rotated).
    assert len(plain) < 10_000 and plain == list(range(10_000 - len(plain), 10_000))
    # Followed from the start, the log is whole across every rotation, in order.
    assert numbered(followed) == list(range(10_000))


@pytest.mark.process
def test_a_container_that_has_ended_is_not_rotated(tmp_path):
    rotation = LogRotation(max_size=1024, max_files=5)
    kubelet = Kubelet(tmp_path / "pods", {}, {}, rotation)
    pod = kubelet.start(plan(BURSTS.format(bursts=3, pause=0)), 0, 0, 0)
    wait_exit(pod)
    time.sleep(rotation.monitor_interval_s + 0.5)  # a monitor round after the end
    assert [p.name for p in pod.folder.glob("node.log*")] == ["node.log"]
    assert numbered(pod.log.splitlines()) == list(range(300))


# ---- the carried files: bounded, whole or missing -----------------------------------------------


def records(n: int, eval_every: int) -> list[bytes]:
    out = []
    for step in range(1, n + 1):
        r = {"step": step, "loss": 5 - step / n, "tokens_per_s": 1000.0 + step % 7}
        if step % eval_every == 0 or step == n:
            r |= {"val_loss": 4.5 - step / n, "val_bpb": 2.0}
        out.append((json.dumps(r) + "\n").encode())
    return out


def test_thinning_keeps_every_evaluation_and_the_last_record_within_the_bound():
    lines = records(60_000, 250)
    kept = thin(lines, CARRY_MAX_RECORDS)
    assert len(kept) <= CARRY_MAX_RECORDS
    assert [ln for ln in lines if b"val_loss" in ln] == [ln for ln in kept if b"val_loss" in ln]
    assert kept[0] == lines[0] and kept[-1] == lines[-1]
    assert kept == sorted(kept, key=lambda ln: json.loads(ln)["step"])
    # Too many evaluations: they are spread over half the bound, the last one kept.
    kept = thin(records(60_000, 1), CARRY_MAX_RECORDS)
    assert len(kept) == CARRY_MAX_RECORDS and kept[-1] == records(60_000, 1)[-1]
    assert thin(lines[:10], CARRY_MAX_RECORDS) == lines[:10]


def test_a_file_over_the_bound_is_named_not_carried_and_a_damaged_block_is_refused(tmp_path):
    (tmp_path / "big.png").write_bytes(b"x" * (CARRY_MAX_BYTES + 1))
    (tmp_path / "ok.md").write_bytes(b"report\n" * 100)
    out = tmp_path / "out"
    with open(out, "w") as f:
        carry(tmp_path, ["big.png", "ok.md"], f)
    log = out.read_text()
    assert "big.png not carried" in log
    assert files_from_log(log) == {"ok.md": b"report\n" * 100}
    # A base64 line lost on the way still decodes: the size and sha256 refuse it.
    lines = log.splitlines()
    damaged = "\n".join(lines[:3] + lines[4:])
    assert files_from_log(damaged) == {}
    reader = CarriedFiles()
    assert [reader.feed(ln) for ln in lines[1:4]][1:] == [None, None]  # inside the block


# ---- through the launcher on the test cluster ---------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64


LONG_RUN = """
import json, os, sys, time
time.sleep(1)  # a pod's start takes seconds on a cluster: the step follows it from its start
r = '/gpt/r/metrics'
os.makedirs(r, exist_ok=True)
with open(r + '/train.jsonl', 'wb') as f:
    f.write(open('/gpt/records.jsonl', 'rb').read())
open(r + '/report.md', 'w').write('# report\\nval loss 3.50\\n\\n![loss](loss.png)\\n')
open(r + '/loss.png', 'wb').write(open('/gpt/loss.png', 'rb').read())
line = 'step {:>6}/100000 | loss 4.0000 | lr 1.00e-03 | 1,000 tok/s | 1m elapsed, ETA 1h\\n'
for i in range(140_000):  # 11 MiB: past containerLogMaxSize
    sys.stdout.write(line.format(i))
sys.stdout.flush()
time.sleep(3.5)  # a kubelet monitor round (every 3 s) while it runs: the log is rotated
"""


@pytest.mark.apiserver
def test_a_log_of_more_than_10_mib_still_delivers_every_artifact(trainer_cluster, tmp_path):
    assert trainer_cluster.kubelet.rotation == LogRotation()  # upstream's 10 MiB
    pvc = tmp_path / "pvc"
    # 200000 records: about 11 MB of train.jsonl, 15 MB of base64 were it carried whole: the
    # kubelet would rotate in the middle of its block and the plain read miss the block's start.
    lines = records(200_000, 250)
    (pvc / "records.jsonl").write_bytes(b"".join(lines))
    (pvc / "loss.png").write_bytes(PNG)
    said = []
    outcome = launcher.launch(stand_in(LONG_RUN), trainer_cluster.namespace, "r",
                              say=said.append)  # fmt: skip
    (pod,) = trainer_cluster.runs[outcome.name].pods
    assert list(pod.folder.glob("node.log.*")), "the log was never rotated"
    files = outcome.files
    assert set(files) == set(TRAIN_FILES)
    assert files[LOSS_PNG] == PNG
    assert files[REPORT_MD] == b"# report\nval loss 3.50\n\n![loss](loss.png)\n"
    carried = files[TRAIN_JSONL].splitlines(keepends=True)
    assert len(carried) <= CARRY_MAX_RECORDS and carried[-1] == lines[-1]
    assert any("train.jsonl carried thinned to" in line for line in said)
    # The KFP artifacts, from the bounded files: the same numbers as from the whole file.
    whole = train_metrics({TRAIN_JSONL: b"".join(lines)})
    got = train_metrics(files)
    assert {k: got[k] for k in ("train_loss", "val_loss", "steps")} == {
        k: whole[k] for k in ("train_loss", "val_loss", "steps")
    }
    assert abs(got["tokens_per_s"] - whole["tokens_per_s"]) < 1
    html = train_report_html("r", files)
    assert "val loss 3.50" in html and "data:image/png;base64," in html
    # Progress was shown as it came, the base64 never.
    assert any(line.startswith("step 139999/100000") for line in said)
    assert not any(len(line) == 76 and " " not in line for line in said)


GATED = """
import os, time
print('step     1/3 | loss 4.1000 | lr 1.00e-03 | 1,234 tok/s | 0s elapsed, ETA 2s', flush=True)
while not os.path.exists('/gpt/go'):
    time.sleep(0.05)
print('done', flush=True)
"""


@pytest.mark.apiserver
def test_progress_reaches_the_step_before_the_trainjob_completes(trainer_cluster, tmp_path):
    ns = trainer_cluster.namespace
    seen = threading.Event()
    said = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("step     1/3 | loss 4.1000"):
            seen.set()

    result = {}
    step = threading.Thread(target=lambda: result.update(
        outcome=launcher.launch(stand_in(GATED), ns, "r", say=say)))  # fmt: skip
    step.start()
    try:
        assert seen.wait(30), f"no progress line while the TrainJob ran: {said}"
        (job,) = trainer_cluster.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)[
            "items"
        ]
        assert not (job.get("status") or {}).get("conditions"), "the TrainJob had already ended"
    finally:
        (tmp_path / "pvc" / "go").touch()
        step.join(60)
    assert result["outcome"].name == job["metadata"]["name"]
    assert said.index("done") > said.index(next(s for s in said if s.startswith("step     1/3")))


FAIL_FIRST = """
import os, sys, time
first = not os.path.exists('/gpt/tried')
open('/gpt/tried', 'a').close()
print('attempt', 'one' if first else 'two', flush=True)
time.sleep(1.5 if first else 0)  # a pod lives a while on a cluster: the step sees it
sys.exit(1 if first else 0)
"""


@pytest.mark.apiserver
def test_a_jobset_restart_is_said_and_the_new_pod_followed(trainer_cluster, tmp_path):
    said = []
    outcome = launcher.launch(stand_in(FAIL_FIRST), trainer_cluster.namespace, "r",
                              say=said.append)  # fmt: skip
    assert trainer_cluster.runs[outcome.name].restarts == 1
    restart = [s for s in said if s.startswith("JobSet restart 1: ")]
    assert len(restart) == 1, said
    assert said.index("attempt one") < said.index(restart[0]) < said.index("attempt two")


# ---- the core API source, against a server that speaks pods and pods/log ------------------------


class CoreV1Server(http.server.ThreadingHTTPServer):
    """Serves `GET .../pods` (two attempts of node 0, one node 1) and a followed `pods/log`
    written in pieces that cut lines, as a kubelet's stream arrives."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), CoreV1Handler)
        self.requests: list[str] = []


class CoreV1Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append(self.path)
        if self.path.startswith("/api/v1/namespaces/ns/pods?"):

            def pod(name, index, attempt, created):
                labels = {"batch.kubernetes.io/job-completion-index": index,
                          "jobset.sigs.k8s.io/restart-attempt": attempt}  # fmt: skip
                return {"metadata": {"name": name, "labels": labels,
                                     "creationTimestamp": created}}  # fmt: skip

            items = [pod("j-node-0-1-bbbbb", "1", "1", "2026-01-01T00:00:05Z"),
                     pod("j-node-0-0-ccccc", "0", "1", "2026-01-01T00:00:04Z"),
                     pod("j-node-0-0-ddddd", "0", "0", "2026-01-01T00:00:01Z")]  # fmt: skip
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                               "items": items}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b"step 1 | lo", b"ss 4.0\nstep 2 | loss 3.9\nst", b"ep 3 | loss 3.8"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def core_v1(monkeypatch):
    from kubernetes import client

    server = CoreV1Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(client.Configuration, "_default", config)
    yield server
    server.shutdown()


def test_the_core_api_source_follows_pods_log_and_finds_node_zeros_newest_pod(core_v1):
    from components.trainjob.podlogs import CoreV1PodLogs, PodRef

    logs = CoreV1PodLogs()
    assert logs.node0("ns", "j") == PodRef("j-node-0-0-ccccc", 1)
    assert logs.pods("ns", "j") == ["j-node-0-0-ccccc", "j-node-0-0-ddddd", "j-node-0-1-bbbbb"]
    assert list(logs.follow("ns", "j-node-0-0-ccccc")) == [
        "step 1 | loss 4.0", "step 2 | loss 3.9", "step 3 | loss 3.8"
    ]  # fmt: skip
    (followed,) = [r for r in core_v1.requests if "/log?" in r]
    assert followed.startswith("/api/v1/namespaces/ns/pods/j-node-0-0-ccccc/log?")
    assert "follow=True" in followed and "container=node" in followed
