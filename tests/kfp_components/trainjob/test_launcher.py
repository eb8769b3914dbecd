"""The TrainJob launcher: names, spec, files through the log, and following a TrainJob for real.

The API-server tests play the Trainer controller: they patch `status.conditions` of the TrainJob
the launcher created, and the launcher must react (watch, not polling sleeps).
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import time

import pytest
from support.apiserver import Controller, condition, namespace

from components.trainjob import launcher, podlogs
from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobSpec
from components.trainjob.placement import Placement
from components.trainjob.stagelog import LOG_TAIL_LINES, container_command, files_from_log
from gpt.stages import STAGES

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SPEC = TrainJobSpec(
    stage="train-gpt",
    runtime="gpt-train-gpt",
    image="example.com/gpt-workload:test",
    command=["python", "-m", "gpt", "train-gpt"],
    args=["--max_iters", "10"],
    env={"A": "1"},
    placement=Placement(num_nodes=2, num_proc_per_node=3, timeout=30),
)


def within(timeout: float, start_timeout: float = 120) -> TrainJobSpec:
    """SPEC with another deadline (and start grace)."""
    placement = dataclasses.replace(SPEC.placement, timeout=timeout, start_timeout=start_timeout)
    return dataclasses.replace(SPEC, placement=placement)


# ---- names and spec -----------------------------------------------------------------------------


@pytest.mark.parametrize("stage", list(STAGES))
def test_names_are_short_unique_labels_that_start_with_the_stage(stage):
    names = {launcher.trainjob_name(stage) for _ in range(50)}
    assert len(names) == 50, "two attempts of one run and stage must never share a name"
    for name in names:
        assert RFC1035.match(name) and len(name) <= launcher.NAME_MAX, name
        assert name.startswith(f"{stage}-")


def test_a_stage_that_cannot_lead_a_name_is_refused():
    assert launcher.trainjob_name("a" * launcher.STAGE_MAX)
    for stage in ("Train", "1-corpus", "a" * (launcher.STAGE_MAX + 1), "x_y"):
        with pytest.raises(ValueError, match="stage"):
            launcher.trainjob_name(stage)


def test_spec_sets_only_runtime_ref_trainer_and_the_deadline():
    body = launcher.build_trainjob(SPEC, "train-gpt-demo-abc123", "training", "Run 1/x")
    assert set(body["spec"]) == {"runtimeRef", "trainer", "activeDeadlineSeconds"}
    # The server's backstop comes after the step's own timeout, in whole seconds.
    assert body["spec"]["activeDeadlineSeconds"] == math.ceil(SPEC.placement.timeout) + 60
    assert body["spec"]["runtimeRef"] == {"name": "gpt-train-gpt"}
    trainer = body["spec"]["trainer"]
    assert set(trainer) <= {
        "image", "command", "args", "env", "numNodes", "numProcPerNode", "resourcesPerNode"
    }  # fmt: skip
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 3
    assert trainer["env"] == [{"name": "A", "value": "1"}]
    labels = body["metadata"]["labels"]
    assert labels[launcher.RUN_LABEL] == "Run-1-x"  # a valid label value, traceable to the run
    assert labels[launcher.STAGE_LABEL] == "train-gpt"


@pytest.mark.parametrize("source", ["s3://gpt-data/books/", "hf://datasets/org/name"])
def test_a_storage_secret_reaches_the_container_by_reference_only(source):
    args = ["--source", source]
    spec = dataclasses.replace(SPEC, storage_secret="gpt-s3", args=args)
    body = launcher.build_trainjob(spec, "train-gpt-demo-abc123", "ns", "r")
    env = body["spec"]["trainer"]["env"]
    assert env[0] == {"name": "A", "value": "1"}
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env[1:]}
    assert all(set(e) == {"name", "valueFrom"} for e in env[1:]), "no value of the Secret's"
    assert set(refs) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                         "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                         "AWS_DEFAULT_REGION", "HF_TOKEN", "HF_ENDPOINT"}  # fmt: skip
    required = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} if source.startswith("s3") else set()
    for name, ref in refs.items():
        assert ref["name"] == "gpt-s3" and ref["key"] == name
        # with s3://, the keys are required (a missing Secret stops the pod, saying so); the
        # rest optional, and all of them for the Hub (a Secret of HF_TOKEN alone)
        assert ref["optional"] is (name not in required)
    assert launcher.build_trainjob(SPEC, "n", "ns", "r")["spec"]["trainer"]["env"] == [
        {"name": "A", "value": "1"}]  # fmt: skip


@pytest.mark.apiserver
def test_trainer_v2_3_admits_the_secret_references(custom_api):
    spec = dataclasses.replace(SPEC, storage_secret="gpt-s3", args=["--source", "s3://b/k"])
    ns = namespace()
    body = launcher.build_trainjob(spec, launcher.trainjob_name("load-corpus"), ns, "r")
    created = custom_api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    env = created["spec"]["trainer"]["env"]
    assert env == body["spec"]["trainer"]["env"], "the server kept every reference as sent"


# ---- files carried back through the log ---------------------------------------------------------


@pytest.mark.process
def test_files_come_back_through_the_log_of_a_real_shell(tmp_path):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    png = bytes(range(256)) * 300  # binary, many base64 lines
    (run / "metrics" / "loss.png").write_bytes(png)
    (run / "metrics" / "train.jsonl").write_text('{"step": 0}\n')
    command = container_command(str(run), ["metrics/loss.png", "metrics/train.jsonl", "nope.txt"])
    out = subprocess.run(
        [*command, "echo", "training output"], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.startswith("training output\n")
    files = files_from_log(out.stdout)
    assert files == {"metrics/loss.png": png, "metrics/train.jsonl": b'{"step": 0}\n'}
    # A TTY (the prompt's container) turns every newline into \r\n.
    assert files_from_log(out.stdout.replace("\n", "\r\n")) == files


@pytest.mark.process
def test_failing_stage_keeps_its_exit_code_and_prints_nothing(tmp_path):
    (tmp_path / "f").write_text("x")
    command = container_command(str(tmp_path), ["f"])
    out = subprocess.run([*command, "sh", "-c", "exit 3"], capture_output=True)
    assert out.returncode == 3 and b"gpt-trainjobs file" not in out.stdout


@pytest.mark.process
def test_only_node_zero_prints_files(tmp_path):
    (tmp_path / "f").write_text("x")
    command = container_command(str(tmp_path), ["f"])
    out = subprocess.run(
        [*command, "true"], capture_output=True, text=True,
        env={"PET_NODE_RANK": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert files_from_log(out.stdout) == {}


# ---- against the API server ---------------------------------------------------------------------


class FakePods:
    """A `PodLogs` with one running node-0 pod per TrainJob, whose log names its TrainJob and
    tail."""

    def refs(self, ns, trainjob):
        return [podlogs.PodRef(f"{trainjob}-node-0-0-abcde", 0, phase="Running")]

    def pods(self, ns, trainjob):
        return [p.name for p in self.refs(ns, trainjob)]

    def log(self, ns, pod, tail):
        return f"log of {pod.removesuffix('-node-0-0-abcde')} (tail={tail})\nline two"


fake_log = FakePods()


@pytest.mark.apiserver
def test_returns_as_soon_as_the_watch_sees_complete(custom_api):
    ns = namespace()
    ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"), delay=1.0)
    outcome = launcher.launch(SPEC, ns, "demo", api=custom_api, pods=fake_log)
    returned_at = time.monotonic()
    assert ctl.error is None
    assert outcome.name == ctl.created["metadata"]["name"]
    latency = returned_at - ctl.patched_at
    print(f"watch latency: {latency * 1000:.0f} ms")
    assert latency < 5  # the watch's event, not the end of its 300 s window (on a busy machine)
    assert outcome.log.startswith(f"log of {outcome.name} (tail=None)")
    # What the server accepted is what the launcher built: the CRD schema and CEL rules passed.
    stored = custom_api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, outcome.name)
    assert stored["spec"]["runtimeRef"]["name"] == "gpt-train-gpt"
    assert stored["spec"]["trainer"]["numProcPerNode"] == 3


@pytest.mark.apiserver
def test_raises_with_reason_message_and_log_tail_on_failed(custom_api):
    ns = namespace()
    Controller(custom_api, ns, condition("Failed", "BackoffLimitExceeded", "node-0 exited 2"))
    with pytest.raises(launcher.TrainJobFailed) as err:
        launcher.launch(SPEC, ns, "demo", api=custom_api, pods=fake_log)
    text = str(err.value)
    assert "BackoffLimitExceeded: node-0 exited 2" in text
    assert f"(tail={LOG_TAIL_LINES})" in text and "line two" in text


@pytest.mark.apiserver
def test_deletes_and_raises_on_timeout(custom_api):
    ns = namespace()
    ctl = Controller(custom_api, ns, None)  # a controller that never finishes the job
    start = time.monotonic()
    with pytest.raises(launcher.TrainJobTimeout, match="did not finish within 2 s; deleted it"):
        launcher.launch(within(2), ns, "demo", api=custom_api, pods=fake_log)
    assert time.monotonic() - start < 4
    ctl.join(5)
    assert ctl.created is not None
    assert custom_api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"] == []


@pytest.mark.apiserver
def test_watch_resumes_after_its_window_ends(custom_api, monkeypatch):
    monkeypatch.setattr(launcher, "WATCH_WINDOW_S", 1)
    ns = namespace()
    ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"), delay=2.5)
    launcher.launch(SPEC, ns, "demo", api=custom_api, pods=fake_log)
    assert time.monotonic() - ctl.patched_at < 1.0


class GoneOnce:
    """The real API, except the first watch answers 410 Gone (the version was compacted)."""

    def __init__(self, api):
        self.api, self.watches = api, 0

    def __getattr__(self, name):
        return getattr(self.api, name)

    def list_namespaced_custom_object(self, *args, **kwargs):
        if kwargs.get("watch"):
            self.watches += 1
            if self.watches == 1:
                from kubernetes.client.rest import ApiException

                raise ApiException(status=410, reason="Gone")
        return self.api.list_namespaced_custom_object(*args, **kwargs)


@pytest.mark.apiserver
def test_watch_recovers_from_410_gone(custom_api):
    ns = namespace()
    api = GoneOnce(custom_api)
    ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"), delay=1.0)
    launcher.launch(SPEC, ns, "demo", api=api, pods=fake_log)
    assert api.watches >= 2 and ctl.patched_at is not None


class WatchFails(GoneOnce):
    """The real API, except every watch answers 500: an error the launcher cannot recover from."""

    def list_namespaced_custom_object(self, *args, **kwargs):
        if kwargs.get("watch"):
            from kubernetes.client.rest import ApiException

            raise ApiException(status=500, reason="Internal Server Error")
        return self.api.list_namespaced_custom_object(*args, **kwargs)


@pytest.mark.apiserver
def test_an_error_while_following_deletes_the_trainjob(custom_api):
    """Nobody follows the TrainJob any more: it must not go on running (nor its pods)."""
    from kubernetes.client.rest import ApiException

    ns = namespace()
    said = []
    with pytest.raises(ApiException):
        launcher.launch(SPEC, ns, "demo", api=WatchFails(custom_api), pods=fake_log,
                        say=said.append)  # fmt: skip
    assert custom_api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"] == []
    assert said[-1].startswith("API error 500 Internal Server Error: deleted TrainJob")


@pytest.mark.apiserver
def test_never_reuses_an_old_trainjob(custom_api):
    ns = namespace()
    names = []
    for _ in range(2):
        ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"), 0.1)
        outcome = launcher.launch(SPEC, ns, "demo", api=custom_api, pods=fake_log)
        names.append(outcome.name)
        ctl.join(5)
        custom_api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, names[-1])
    assert names[0] != names[1]


def test_the_log_reader_tolerates_a_server_without_pods(apiserver, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(apiserver.kubeconfig))
    launcher.load_kube_config()
    log = podlogs.node0_log(podlogs.CoreV1PodLogs(), "training", "train-gpt-x-abc123", 10)
    assert "no pods found" in log


# ---- the start grace: a TrainJob that makes no pods ---------------------------------------------


class NoPods:
    """A `PodLogs` where no pod ever appears."""

    def refs(self, ns, trainjob):
        return []

    def pods(self, ns, trainjob):
        return []

    def log(self, ns, pod, tail):
        return "unavailable"


class NoEvents:
    def warnings(self, namespace, kind, name, uid):
        return []


@pytest.mark.apiserver
def test_no_pods_and_no_event_fails_within_the_grace_saying_so_and_deletes(custom_api):
    ns = namespace()
    ctl = Controller(custom_api, ns, None)  # a Trainer that never makes a JobSet
    began = time.monotonic()
    with pytest.raises(launcher.TrainJobStuck) as err:
        launcher.launch(within(60, start_timeout=1), ns, "demo", api=custom_api, pods=NoPods(),
                        events=NoEvents(), say=lambda _: None)  # fmt: skip
    assert time.monotonic() - began < 5  # the grace ends the wait, not the 60 s deadline
    name = ctl.created["metadata"]["name"]
    assert str(err.value) == (
        f"TrainJob {ns}/{name} made no pods within 1 s: no Warning Event on it says why; deleted it"
    )
    assert custom_api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"] == []


def launch_with_a_running_jobset(custom_api, api, complete_after: float):
    """Launch with a start grace of 1 s on `api`: the TrainJob's JobSet runs (Trainer's
    jobsStatus) from its first version on, its pods never appear, and it completes
    `complete_after` seconds after the test's Trainer first sees it."""
    ns = namespace()
    ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"),
                     delay=complete_after)  # fmt: skip
    jobs = {"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}

    def running(obj):
        if not (obj.get("status") or {}).get("jobsStatus"):
            custom_api.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, PLURAL, obj["metadata"]["name"],
                {"status": {"jobsStatus": [jobs]}})  # fmt: skip

    outcome = launcher.launch(within(30, start_timeout=1), ns, "demo", api=api, pods=NoPods(),
                              events=NoEvents(), on_update=running, say=lambda _: None)  # fmt: skip
    assert ctl.error is None
    return outcome


@pytest.mark.apiserver
def test_a_trainjob_whose_jobset_runs_outlives_the_grace_before_its_pods_appear(custom_api):
    # Pods can be Pending or not yet listed while the JobSet exists: Trainer's jobsStatus says so.
    outcome = launch_with_a_running_jobset(custom_api, custom_api, complete_after=2.5)
    assert outcome.elapsed_s > 2


class SlowAdmission:
    """The API server behind admission that holds each create `seconds` (webhooks, CEL rules
    compiled on a TrainJob CRD's first use: 2 s on a loaded test server)."""

    def __init__(self, api, seconds: float):
        self.api, self.seconds = api, seconds

    def create_namespaced_custom_object(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.api.create_namespaced_custom_object(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.api, name)


@pytest.mark.apiserver
def test_the_start_grace_counts_from_the_creation_not_the_request(custom_api):
    """A create admitted 1.5 s after it was sent, whose JobSet starts at once: started within its
    grace of 1 s (counted from the request, the grace was spent before the TrainJob existed)."""
    slow = SlowAdmission(custom_api, 1.5)
    outcome = launch_with_a_running_jobset(custom_api, slow, complete_after=1)
    assert outcome.elapsed_s > 2.5


class Listed:
    """A `PodLogs` listing the given pods."""

    def __init__(self, *pods):
        self.listed = list(pods)

    def refs(self, ns, trainjob):
        return self.listed


def startup(pods, grace=60) -> launcher._Startup:
    return launcher._Startup("ns", "j", "u", pods, NoEvents(), grace, time.monotonic() + grace)


def test_each_pod_has_its_own_grace_from_its_creation():
    now = time.time()
    # A JobSet restart: attempt 0's pod ran long ago; attempt 1's, just made, waits its turn.
    restarted = startup(Listed(podlogs.PodRef("j-node-0-0-new", 1, created=now, phase="Pending"),
                               podlogs.PodRef("j-node-0-0-old", 0, created=now - 600,
                                              phase="Failed")))  # fmt: skip
    restarted.check({})
    # The next look is when the new pod's grace ends.
    assert 55 < restarted.next_check - time.monotonic() <= 60
    # The same pod, Pending since longer than the grace, is stuck, with why its status says.
    stuck = startup(Listed(podlogs.PodRef("j-node-0-0-new", 1, created=now - 61, phase="Pending",
                                          waiting="ContainerCreating")))  # fmt: skip
    with pytest.raises(launcher.TrainJobStuck, match=(
            "TrainJob ns/j's pod j-node-0-0-new is still Pending 60 s after its creation: "
            "ContainerCreating$")):  # fmt: skip
        stuck.check({})
