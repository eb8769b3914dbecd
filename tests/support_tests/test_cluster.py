"""The test cluster itself (tests/support/cluster/): it renders TrainJobs as Trainer v2.3 does and
runs them as JobSet and the kubelet would, on the upstream `torch-distributed` runtime too."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml
from support.cluster import PROJECT, jobset_webhook, runtimes
from support.cluster.controller import _reserve_port
from support.cluster.jobset_webhook import admission_error
from support.cluster.render import master_addr, render

from components.step.image_names import workload_image
from components.trainjob import launcher, logfollow
from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobSpec
from components.trainjob.placement import Placement
from components.trainjob.podlogs import LogDirPodLogs
from gpt.stages import STAGES

RUNTIMES = {}


def runtime(shared, name: str) -> dict:
    if not RUNTIMES:
        RUNTIMES.update({rt["metadata"]["name"]: rt for rt in runtimes(shared)})
    return RUNTIMES[name]


def trainjob(runtime_name: str, **trainer) -> dict:
    return {
        "metadata": {"name": "train-gpt-r-abc123", "namespace": "training"},
        "spec": {"runtimeRef": {"name": runtime_name}, "trainer": trainer},
    }


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_render_merges_the_trainer_fields_and_injects_the_torch_env(shared):
    job = trainjob("gpt-train-gpt", image="img:1", command=["sh"], args=["-c", "true"],
                   env=[{"name": "HOME", "value": "/home/x"}, {"name": "A", "value": "1"}],
                   numNodes=2, numProcPerNode=3,
                   resourcesPerNode={"limits": {"nvidia.com/gpu": 1}})  # fmt: skip
    r = render(job, runtime(shared, "gpt-train-gpt"))
    c = r.container
    assert (c["image"], c["command"], c["args"]) == ("img:1", ["sh"], ["-c", "true"])
    env = env_of(c)
    assert env["HOME"] == "/home/x" and env["A"] == "1"  # the TrainJob's env wins by name
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "3"
    assert env["PET_MASTER_ADDR"] == "train-gpt-r-abc123-node-0-0.train-gpt-r-abc123"
    assert env["PET_MASTER_PORT"] == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"]["fieldRef"]["fieldPath"]
    # resourcesPerNode merges over the runtime's requests, key by key.
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert c["resources"]["requests"]["cpu"] == "2"
    assert r.num_nodes == 2 and r.backoff_limit == 0
    assert master_addr("x") == "x-node-0-0.x"


def test_render_of_the_upstream_runtime_takes_the_defaults(shared):
    upstream = runtime(shared, "torch-distributed")
    r = render(trainjob("torch-distributed", command=["true"]), upstream)
    assert r.num_nodes == 1 and r.backoff_limit == 6 and r.max_restarts is None
    # numProcPerNode "auto" without GPUs or CPU requests: max(1, 0 CPUs).
    assert env_of(r.container)["PET_NPROC_PER_NODE"] == "1"


PRINT_ENV = (
    "import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('PET_')})); "
    "sys.exit(int(os.environ.get('FAIL_ON_RANK', '-1') == os.environ['PET_NODE_RANK']))"
)


def spec(runtime_name: str, nodes: int, env: dict | None = None, **placement) -> TrainJobSpec:
    return TrainJobSpec(
        stage="torch-distributed", runtime=runtime_name, image="pytorch/pytorch:2.13.0",
        command=["python", "-c", PRINT_ENV], env=env or {},
        placement=Placement(num_nodes=nodes, timeout=60, **placement),
    )  # fmt: skip


@pytest.mark.apiserver
def test_the_upstream_runtime_runs_one_pod_per_node_named_as_jobset_names_them(trainer_cluster):
    ns = trainer_cluster.namespace
    outcome = launcher.launch(spec("torch-distributed", 2), ns, "up", say=lambda _: None)
    run = trainer_cluster.runs[outcome.name]
    assert [p.index for p in run.pods] == [0, 1]
    for pod in run.pods:
        assert re.fullmatch(rf"{outcome.name}-node-0-{pod.index}-[b-z2-9]{{5}}", pod.name)
        # What torchrun would see: the cluster's own values, and the pod's node rank.
        assert pod.env["PET_NODE_RANK"] == str(pod.index) and pod.env["PET_NNODES"] == "2"
        assert pod.env["PET_MASTER_ADDR"] == master_addr(outcome.name)
        printed = json.loads(pod.log.splitlines()[0])
        assert printed["PET_NODE_RANK"] == str(pod.index)
        assert printed["PET_MASTER_ADDR"] == "127.0.0.1"  # the DNS name, resolved here
    # The launcher read node 0's log through the log folder.
    assert '"PET_NODE_RANK": "0"' in outcome.log
    stored = trainer_cluster.api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                              outcome.name)  # fmt: skip
    (done,) = stored["status"]["conditions"]
    assert (done["type"], done["reason"]) == ("Complete", "AllJobsCompleted")


@pytest.mark.apiserver
def test_a_failed_pod_is_retried_within_backoff_limit_then_fails_the_jobset(trainer_cluster):
    # The upstream runtime keeps the Job's default backoffLimit 6: node 1 fails every time,
    # so the Job sees 7 failures, then the JobSet (no failurePolicy) fails.
    ns = trainer_cluster.namespace
    with pytest.raises(launcher.TrainJobFailed) as err:
        launcher.launch(spec("torch-distributed", 2, {"FAIL_ON_RANK": "1"}), ns, "up",
                        say=lambda _: None)  # fmt: skip
    (run,) = trainer_cluster.runs.values()
    assert [p.index for p in run.pods].count(1) == 7
    assert "FailedJobs: jobset failed due to one or more job failures (first failed job: " in str(
        err.value)
    assert f"{run.trainjob['metadata']['name']}-node-0)" in str(err.value)
    assert "Log tail:" in str(err.value)


def pod_folder(root, pod: str, index: str) -> None:
    """`<root>/ns/<pod>/labels.json`, as the kubelet writes it, for a pod of JobSet `pod[0]`."""
    (root / "ns" / pod).mkdir(parents=True)
    labels = {"jobset.sigs.k8s.io/jobset-name": pod[0],
              "batch.kubernetes.io/job-completion-index": index}  # fmt: skip
    (root / "ns" / pod / "labels.json").write_text(json.dumps(labels))


def test_node_0s_rendezvous_port_is_no_other_sockets_while_the_attempt_runs():
    """Pods share this machine's ports (a cluster gives each its own): the port mapped to
    PET_MASTER_PORT stays out of every other socket's reach until node 0's torchrun listens on
    it, which it still can. A port only found free was taken under a busy suite: the lost-node
    test's next attempt then failed to listen, EADDRINUSE (controller.py `_reserve_port`)."""
    import torch.distributed as dist

    with _reserve_port() as reserved:
        port = reserved.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # another process's socket, e.g. a connect's
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
        store.set("rendezvous", "node 0")
        assert store.get("rendezvous") == b"node 0"


def test_the_log_folder_lists_pods_node_zero_first(tmp_path):
    for pod, index in (("j-node-0-1-abcde", "1"), ("j-node-0-0-fghjk", "0"), ("k-node-0-0-x", "0")):
        pod_folder(tmp_path, pod, index)
        (tmp_path / "ns" / pod / "node.log").write_text("a\nb\nc\n")
    logs = LogDirPodLogs(tmp_path)
    assert logs.pods("ns", "j") == ["j-node-0-0-fghjk", "j-node-0-1-abcde"]
    assert logs.log("ns", "j-node-0-0-fghjk", 2) == "b\nc\n"
    assert "unavailable" in logs.log("ns", "gone", None)


def test_a_pod_deleted_while_the_folder_is_listed_is_left_out(tmp_path, monkeypatch):
    """The kubelet's delete moves a pod's folder away at any moment: one gone between the
    listing and its read is not listed (it was an error that ended the step's wait)."""
    for pod, index in (("j-node-0-0-fghjk", "0"), ("j-node-0-1-abcde", "1")):
        pod_folder(tmp_path, pod, index)
    glob = Path.glob

    def listed_then_deleted(self, pattern):
        found = list(glob(self, pattern))
        if pattern == "*/labels.json":  # node 1 deleted after the listing saw it
            shutil.move(tmp_path / "ns" / "j-node-0-1-abcde", tmp_path / "deleted")
        return iter(found)

    monkeypatch.setattr(Path, "glob", listed_then_deleted)
    assert LogDirPodLogs(tmp_path).pods("ns", "j") == ["j-node-0-0-fghjk"]


# ---- names JobSet admits (kubernetes-sigs/jobset v0.12.0 pkg/webhooks/jobset_webhook.go) -------

KFP_RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id: a 36-character UUID
PROJECT_RUNTIMES = {p.stem: yaml.safe_load(p.read_text())
                    for p in PROJECT.glob("runtimes/gpt-*.yaml")}  # fmt: skip
DENIED = 'admission webhook "vjobset.kb.io" denied the request: JobSet.jobset.x-k8s.io'


def jobset_of(name: str, num_nodes: int, stage: str = "train-gpt") -> dict:
    """The JobSet Trainer applies for a TrainJob `name` of `stage` on `num_nodes` nodes."""
    runtime_name = STAGES[stage].runtime
    job = {"metadata": {"name": name, "namespace": "ns"},
           "spec": {"runtimeRef": {"name": runtime_name}, "trainer": {"numNodes": num_nodes}}}
    return render(job, PROJECT_RUNTIMES[runtime_name]).jobset  # fmt: skip


def test_the_rendered_jobset_is_one_replica_of_num_nodes_indexed_pods():
    (rjob,) = jobset_of("j", 4)["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (rjob["name"], rjob["replicas"], job["completions"], job["parallelism"]) == (
        "node", 1, 4, 4)  # fmt: skip


def test_the_jobset_webhook_refuses_a_pod_name_over_63_characters():
    # `<jobset>-node-0-<numNodes-1>-abcde`: 15 characters beside a 48-character name on one node.
    assert admission_error(jobset_of("a" * 48, 1)) is None
    assert admission_error(jobset_of("a" * 49, 1)) == (
        f'{DENIED} "{"a" * 49}" is invalid: spec.replicatedJobs[0].name: Invalid value: '
        f'"{"a" * 49}-node-0": {jobset_webhook.POD_NAME_TOO_LONG}'
    )
    assert admission_error(jobset_of("a" * 48, 11)) is not None  # two digits for node index 10
    assert admission_error(jobset_of("a" * 47, 11)) is None


def test_the_jobset_webhook_aggregates_and_dedupes_its_errors():
    # A 57-character name: the Job name (64) and the pod name are both too long.
    refused = admission_error(jobset_of("a" * 57, 1))
    assert refused.startswith(f'{DENIED} "{"a" * 57}" is invalid: [')
    assert jobset_webhook.JOB_NAME_TOO_LONG in refused
    assert jobset_webhook.POD_NAME_TOO_LONG in refused
    # A name starting with a digit: the Job and the pod checks say the same, said once.
    refused = admission_error(jobset_of("9abc", 1))
    assert refused.count("a DNS-1035 label must") == 1 and "is invalid: spec." in refused


def test_the_jobset_webhook_checks_group_name_and_subdomain():
    js = jobset_of("ok", 1)
    js["spec"]["replicatedJobs"][0]["groupName"] = "g" * 64
    assert jobset_webhook.GROUP_NAME_TOO_LONG in admission_error(js)
    js = jobset_of("ok", 1)
    js["spec"]["network"] = {"subdomain": "Not_A_Label"}
    refused = admission_error(js)
    assert "RFC 1123 subdomain" in refused and "DNS-1035 label" in refused
    js["spec"]["coordinator"] = {"replicatedJob": "node"}
    with pytest.raises(NotImplementedError, match="coordinator"):
        admission_error(js)


def test_what_12ee68a_named_a_trainjob_of_a_kfp_run_is_refused():
    # `<stage>-<run>-<6 hex>` with the run id, as components/trainjob/launcher.py named it at
    # 12ee68a.
    for stage in STAGES:
        assert admission_error(jobset_of(f"{stage}-{KFP_RUN_ID}-abc123", 1, stage)), stage


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_name_the_launcher_makes_is_admitted_for_any_node_count(stage):
    # numNodes is an int32 in the TrainJob CRD (kubeflow/trainer v2.3.0 trainjob_types.go), and
    # the components take any count from 1.
    for num_nodes in (1, 2, 10, 1000, 2**31 - 1):
        name = launcher.trainjob_name(stage)
        assert admission_error(jobset_of(name, num_nodes, stage)) is None, (name, num_nodes)


def test_the_launchers_name_bound_is_the_webhooks_at_the_largest_node_count():
    most = 2**31 - 1  # numNodes is an int32
    assert admission_error(jobset_of("a" * launcher.NAME_MAX, most)) is None
    assert admission_error(jobset_of("a" * (launcher.NAME_MAX + 1), most)) is not None
    longest = launcher.trainjob_name("a" * launcher.STAGE_MAX)
    assert admission_error(jobset_of(longest, most)) is None


@pytest.mark.apiserver
def test_a_train_gpt_trainjob_of_a_kfp_run_runs_on_two_nodes(trainer_cluster):
    # With a KFP run id, 12ee68a named it `train-gpt-<run id>-<6 hex>` (53 characters): JobSet
    # refused its JobSet, Trainer only said so in an Event, and the step waited its timeout out.
    job = dataclasses.replace(spec("torch-distributed", 2), stage="train-gpt",
                              placement=Placement(num_nodes=2, timeout=20))  # fmt: skip
    outcome = launcher.launch(job, trainer_cluster.namespace, KFP_RUN_ID, say=lambda _: None)
    stored = trainer_cluster.api.get_namespaced_custom_object(
        GROUP, VERSION, trainer_cluster.namespace, PLURAL, outcome.name)
    assert stored["metadata"]["labels"]["pipeline/runid"] == KFP_RUN_ID
    assert stored["metadata"]["labels"]["gpt-trainjobs/stage"] == "train-gpt"
    assert [p.index for p in trainer_cluster.runs[outcome.name].pods] == [0, 1]


@pytest.mark.apiserver
def test_a_trainjob_whose_jobset_is_refused_fails_the_step_with_the_event_and_is_deleted(
    trainer_cluster, monkeypatch
):
    # A name JobSet refuses (what the launcher made of a KFP run id at 12ee68a): Trainer v2.3
    # records a Warning Event and no condition; the step must not wait for its timeout.
    monkeypatch.setattr(launcher, "trainjob_name", lambda stage: f"{stage}-{KFP_RUN_ID}-abc123")
    ns = trainer_cluster.namespace
    began = time.monotonic()
    with pytest.raises(launcher.TrainJobStuck) as err:
        launcher.launch(spec("torch-distributed", 1, start_timeout=2), ns, KFP_RUN_ID,
                        say=lambda _: None)  # fmt: skip
    assert time.monotonic() - began < 15  # the grace, not the 60 s timeout
    message = str(err.value)
    assert "\n" not in message
    assert "made no pods within 2 s: TrainJobResourcesCreationFailed: TrainJob resources " \
           "reconciliation failed: admission webhook" in message  # fmt: skip
    assert jobset_webhook.POD_NAME_TOO_LONG in message
    # Requeued many times within the grace, written as a series of two (client-go tools/events).
    assert message.endswith(" (x2); deleted it")
    listed = trainer_cluster.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    assert listed["items"] == []
    (run,) = trainer_cluster.runs.values()
    assert run.pods == []


@pytest.mark.apiserver
def test_a_trainjob_past_its_timeout_is_deleted_and_its_log_tail_kept(trainer_cluster,
                                                                       monkeypatch):
    # A stage that does not end at SIGTERM (as a PID 1 without a handler for it): its pod runs
    # out the termination grace, and the step does not wait for its log to end meanwhile, however
    # long an ended TrainJob's log may take to drain.
    monkeypatch.setattr(logfollow, "DRAIN_S", 600.0)
    job = TrainJobSpec(stage="load-corpus", runtime="gpt-load-corpus", image="img:1",
                       command=["python", "-c", "import signal, time; "
                                "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                "print('still reading', flush=True); time.sleep(600)"],
                       placement=Placement(timeout=5))  # fmt: skip
    with pytest.raises(launcher.TrainJobTimeout) as err:
        launcher.launch(job, trainer_cluster.namespace, "r", say=lambda _: None)
    assert "did not finish within 5 s; deleted it" in str(err.value)
    assert str(err.value).endswith("Log tail:\nstill reading\n")
    (run,) = trainer_cluster.runs.values()
    assert run.pods[0].proc.poll() is None, "the step waited out the deleted pod's grace"


@pytest.mark.apiserver
def test_a_pod_whose_namespace_lacks_the_claim_stays_pending(trainer_cluster):
    # The claim is in `training` (where 12ee68a's manifests put it), the TrainJob in the
    # cluster's own namespace: its pod is never scheduled, and the scheduler says why.
    ns = trainer_cluster.namespace
    (pvc,) = trainer_cluster.kubelet.claims.values()
    trainer_cluster.kubelet.claims = {("training", "gpt-pvc"): pvc}  # only there
    job = TrainJobSpec(stage="load-corpus", runtime="gpt-load-corpus", image="img:1",
                       command=["python", "-c", "print('ran')"],
                       placement=Placement(timeout=3))  # fmt: skip
    with pytest.raises(launcher.TrainJobTimeout):
        launcher.launch(job, ns, "r", say=lambda _: None)
    (run,) = trainer_cluster.runs.values()
    (pod,) = run.pods
    assert "ran" not in pod.log
    events = [json.loads(p.read_text())
              for p in (trainer_cluster.kubelet.logs / ns / ".events").glob("*.json")]  # fmt: skip
    assert [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in events] == [
        (pod.name, "FailedScheduling",
         '0/1 nodes are available: persistentvolumeclaim "gpt-pvc" not found.')
    ]  # fmt: skip


# ---- pods that never start: the start grace (Placement.start_timeout) ends the wait ------------


def pod_events(cluster, pod: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events on `pod`, as the test cluster wrote them."""
    events = [json.loads(p.read_text())
              for p in (cluster.kubelet.logs / cluster.namespace / ".events").glob("*.json")]
    return sorted((e["type"], e["reason"], e["message"]) for e in events
                  if e["involvedObject"]["name"] == pod)  # fmt: skip


def status_of(cluster, pod) -> dict:
    return cluster.kubelet.status(pod)


@pytest.mark.apiserver
def test_an_image_the_registry_lacks_fails_the_step_within_the_grace_with_the_pull_error(
    trainer_cluster
):
    ns, good = trainer_cluster.namespace, workload_image()
    trainer_cluster.kubelet.images = {good}
    typo = good.replace(":", ":v")  # a tag that was never pushed
    began = time.monotonic()
    with pytest.raises(launcher.TrainJobStuck) as err:
        launcher.launch(dataclasses.replace(spec("torch-distributed", 1, start_timeout=3),
                                            image=typo), ns, "r", say=lambda _: None)  # fmt: skip
    assert time.monotonic() - began < 15  # the grace, not the 60 s timeout
    (run,) = trainer_cluster.runs.values()
    (pod,) = run.pods
    message = str(err.value)
    assert "\n" not in message and message.endswith("; deleted it")
    assert re.fullmatch(
        rf"TrainJob {ns}/\S+'s pod {pod.name} is still Pending 3 s after its creation: "
        rf'(ImagePullBackOff: Back-off pulling image "{re.escape(typo)}"|ErrImagePull: rpc error: '
        rf'code = NotFound desc = failed to pull and unpack image "{re.escape(typo)}": .*); '
        r"deleted it", message)  # fmt: skip
    assert pod.log == ""  # its container never ran
    # What `kubectl describe pod` would show: the kubelet's pulls, failures and back-off.
    # (The recorder folds the kubelet's later `Failed` Events, `Error: ErrImagePull` and
    # `Error: ImagePullBackOff`, into the first one's series: tools/events keys no message.)
    said = pod_events(trainer_cluster, pod.name)
    assert ("Warning", "Failed", f'Failed to pull image "{typo}": rpc error: code = NotFound desc '
            f'= failed to pull and unpack image "{typo}": failed to resolve reference "{typo}": '
            f"{typo}: not found") in said  # fmt: skip
    assert ("Normal", "BackOff", f'Back-off pulling image "{typo}"') in said
    status = status_of(trainer_cluster, pod)
    assert status["phase"] == "Pending"
    (node,) = status["containerStatuses"]
    assert node["state"]["waiting"]["reason"] in ("ErrImagePull", "ImagePullBackOff")
    assert trainer_cluster.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)[
        "items"] == []  # fmt: skip


@pytest.mark.apiserver
def test_the_registrys_image_runs_and_its_status_says_so(trainer_cluster):
    trainer_cluster.kubelet.images = {workload_image()}
    job = dataclasses.replace(spec("torch-distributed", 1, start_timeout=3), image=workload_image())
    outcome = launcher.launch(job, trainer_cluster.namespace, "r", say=lambda _: None)
    (pod,) = trainer_cluster.runs[outcome.name].pods
    status = status_of(trainer_cluster, pod)
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


@pytest.mark.apiserver
def test_a_gpu_no_machine_has_fails_the_step_within_the_grace_with_the_schedulers_message(
    trainer_cluster
):
    ns = trainer_cluster.namespace
    began = time.monotonic()
    with pytest.raises(launcher.TrainJobStuck) as err:
        launcher.launch(spec("torch-distributed", 1, gpus_per_node=1, start_timeout=3), ns, "r",
                        say=lambda _: None)  # fmt: skip
    assert time.monotonic() - began < 15
    (run,) = trainer_cluster.runs.values()
    (pod,) = run.pods
    scheduler = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes "
                 "are available: 2 No preemption victims found for incoming pod..")  # fmt: skip
    assert str(err.value).endswith(
        f"'s pod {pod.name} is still Pending 3 s after its creation: Unschedulable: {scheduler}; "
        f"deleted it")  # fmt: skip
    assert pod_events(trainer_cluster, pod.name) == [("Warning", "FailedScheduling", scheduler)]
    (scheduled,) = status_of(trainer_cluster, pod)["conditions"]
    assert (scheduled["type"], scheduled["status"], scheduled["reason"]) == (
        "PodScheduled", "False", "Unschedulable")  # fmt: skip
    assert "containerStatuses" not in status_of(trainer_cluster, pod)
    assert trainer_cluster.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)[
        "items"] == []  # fmt: skip


def test_shutdown_never_meets_a_run_not_yet_started(monkeypatch, tmp_path):
    """The watch thread adds a TrainJob's run while the fixture shuts the cluster down: a run
    seen in `runs` before it was started made the teardown fail ("cannot join thread before it
    is started"), once in a full suite. The start is slowed here to hold that window open."""
    from support.cluster import controller

    entered = threading.Event()

    class SlowToStart(controller.JobSetRun):
        def start(self) -> None:
            entered.set()
            time.sleep(0.5)
            super().start()

        def run(self) -> None:
            self.deleted.wait()

    class OneTrainJob:
        def list_namespaced_custom_object(self, *args):
            return {"items": [{"metadata": {"name": "j-1"}}]}

    monkeypatch.setattr(controller, "JobSetRun", SlowToStart)
    kubelet = controller.Kubelet(tmp_path / "pods", {}, {})
    cluster = controller.Cluster(OneTrainJob(), "ns", kubelet)
    assert entered.wait(10)
    cluster.shutdown()  # raised RuntimeError before the run was added only once started
    assert [r.is_alive() for r in cluster.runs.values()] == [False]
