"""Every way the cluster stops a train-gpt TrainJob, on the test cluster: an eviction (a drain,
a preemption) is a checkpoint and a resume, KFP's Terminate leaves nothing running, a bad flag
fails once, and the server's own deadline ends a TrainJob nobody deletes.

The rules played are cluster/kubelet.py's (SIGTERM to the container's PID 1 only, SIGKILL after
the grace period) and cluster/failure.py's (the Job's podFailurePolicy, JobSet's failure rules).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.cluster.kfp_step import step_env
from support.cluster.kubelet import pid_namespaces
from support.runs import (
    STOPPABLE,
    TINY_DDP,
    TINY_PIPELINE,
    assert_same_weights,
    model_weights,
    uninterrupted,
    write_data,
)
from support.trainjobs import stand_in, train_on_cluster

from components.step.dispatch import run_stage
from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobFailed
from components.trainjob.placement import Placement
from gpt.rundir.layout import RunDir
from pipeline.__main__ import COMPILED

pytestmark = [pytest.mark.slow, pytest.mark.apiserver]

def _node0_log(job, attempt: int) -> str:
    """The log of node 0's pod in the JobSet's attempt `attempt`, "" before it has one (or while
    it is being moved)."""
    pod = job.current.get(0)
    try:
        return pod.log if pod and pod.attempt == attempt else ""
    except FileNotFoundError:
        return ""


def _step_shown(log: str) -> int:
    found = re.findall(r"^step\s+(\d+)/", log, flags=re.M)
    return int(found[-1]) if found else 0


def _evict_at(cluster, run: str, evictions: list[tuple[int, int]]) -> threading.Thread:
    """A thread that evicts node `index` of `run`'s TrainJob once node 0's log shows `step`, for
    each (index, step) of `evictions` in turn: more than one on two nodes only, where each
    eviction restarts the JobSet and the next one waits for the restarted pods (attempt n)."""
    seen = set(cluster.runs)

    def evict() -> None:
        job = _new_run(cluster, seen, run)
        for n, (index, step) in enumerate(evictions):
            while job.restarts < n:  # the JobSet's restart after the eviction before
                time.sleep(0.02)
            while _step_shown(_node0_log(job, n)) < step:
                time.sleep(0.02)
            job.evict(index)

    thread = threading.Thread(target=evict, daemon=True)
    thread.start()
    return thread


def _new_run(cluster, seen: set[str], arg: str = "", timeout: float = 120):
    """The first TrainJob not in `seen` whose trainer args hold `arg`, once there is one."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for name, job in list(cluster.runs.items()):
            if name not in seen and arg in " ".join(job.trainjob["spec"]["trainer"]["args"]):
                return job
        time.sleep(0.02)
    raise TimeoutError(f"no new TrainJob for {arg!r}")


@pytest.mark.minutes
@pytest.mark.skipif(not pid_namespaces(), reason="PID namespaces need root (cluster/pid1.py)")
def test_an_evicted_trainjob_checkpoints_and_resumes_bit_identical(pvc, trainer_cluster,
                                                                    tmp_path_factory):
    """Evictions at random steps, of one node's TrainJob, and of each node of a two-node one in
    turn (node 1, whose stop reaches rank 0 as a signal to another rank; then, once resumed,
    node 0, whose rank writes the checkpoint): each SIGTERM becomes a checkpoint at the step
    training reached (none lost), the TrainJob goes on from it, and ends with the weights of an
    uninterrupted run. (Two runs: each is a whole training run, and they were most of CI's
    time; each CI run draws new steps.)"""
    rng = random.Random()
    # Uninterrupted: one node's run as one process of one thread (the pod's), two nodes' as two
    # ranks here.
    reference = {nodes: uninterrupted(tmp_path_factory, nodes) for nodes in (1, 2)}
    # Anywhere but the last 20 steps, which a stop could overrun: the run would end. The two
    # nodes' second eviction in the second half, after the first one's resume.
    last = STOPPABLE["max_iters"] - 20
    half = STOPPABLE["max_iters"] // 2
    trials = [(1, [(0, rng.randrange(5, last))]),
              (2, [(1, rng.randrange(5, half - 10)), (0, rng.randrange(half, last))])]
    for trial, (nodes, evictions) in enumerate(trials):
        run = f"evicted-{trial}"
        write_data(pvc, run)
        evictor = _evict_at(trainer_cluster, run, evictions)
        try:
            train_on_cluster(trainer_cluster, run, nodes, 1, **STOPPABLE)
            evictor.join(10)
            job = _job_of(trainer_cluster, run)
            _check_resumed(pvc, run, job, evictions, nodes, reference[nodes])
        except Exception as e:
            raise AssertionError(f"trial {trial}: {nodes} node(s), evicted (node, at step) "
                                 f"{evictions}: {e}\n{_pod_logs(_job_of(trainer_cluster, run))}"
                                 ) from e


def _job_of(cluster, run: str):
    return next(j for j in cluster.runs.values() if run in j.trainjob["spec"]["trainer"]["args"])


def _pod_logs(job) -> str:
    """Every pod's status and log tail, to tell which one a failed trial waited on."""
    parts = []
    for pod in job.pods:
        try:
            log = pod.log
        except FileNotFoundError:
            log = "(log gone)"
        parts.append(f"--- pod {pod.name} (node {pod.index}, attempt {pod.attempt}, exit "
                     f"{pod.exit_code}):\n" + "\n".join(log.splitlines()[-15:]))  # fmt: skip
    return "\n".join(parts)


def _check_resumed(pvc: Path, run: str, job, evictions: list[tuple[int, int]], nodes: int,
                   reference: dict) -> None:  # fmt: skip
    """After each eviction node 0 stopped at a checkpoint at or after the step it was evicted
    at, its next pod resumed from it, and the run ended with the uninterrupted run's weights."""
    # Node 0's pods that trained, in the order they started. Not one the Job made in place of an
    # evicted node 0 and deleted before it trained: with two nodes, when node 1 ends more than a
    # Job sync (SYNC_BATCH_S) after node 0, the sync that finds node 0 evicted replaces it
    # (podFailurePolicy Ignore), and the next finds node 1 failed and fails the Job, deleting
    # the replacement (as upstream's job controller does; seen in make test under load).
    node0 = [p for p in job.pods if p.index == 0 and "train-gpt: " in p.log]
    assert len(node0) == len(evictions) + 1, f"{len(node0)} pods of node 0"
    for (_, step), before, after in zip(evictions, node0, node0[1:], strict=False):
        stopped = re.search(r"stopped by (SIGTERM|a signal to another rank) at step (\d+) "
                            rf"of {STOPPABLE['max_iters']}, checkpoint written",
                            before.log)  # fmt: skip
        assert stopped, f"node 0's pod {before.name} never said where it stopped"
        at = int(stopped.group(2))
        assert at >= step, f"stopped at {at}, before the step shown ({step})"
        assert f"resumed from step-{at}: step {at}" in after.log
    # One node: the Job replaced the evicted pod without using the JobSet's restarts.
    # Two: the other node's stop counts as its failure, a restart of the JobSet each.
    assert job.restarts == (0 if nodes == 1 else len(evictions))
    assert_same_weights(model_weights(RunDir.of(pvc, run)), reference,
                        "the end against the uninterrupted run's")


def test_a_bad_flag_fails_the_trainjob_once(trainer_cluster):
    """Exit status 2 (gpt/errors.py EXIT_FATAL) fails the Job by its podFailurePolicy and the
    JobSet by its rule: no restart, one pod, the stage's one line in the step's error."""
    values = {"root": "/gpt", "run": "no-such-run", **TINY_DDP}
    start = time.monotonic()
    with pytest.raises(TrainJobFailed) as failed:
        run_stage("train-gpt", values, Placement(timeout=120), backend="trainjob",
                  image="gpt-workload:t", namespace=trainer_cluster.namespace,
                  say=lambda _: None)  # fmt: skip
    message = str(failed.value)
    assert "FailJobSetFailurePolicyAction" in message
    assert "python -m gpt train-gpt: error: " in message and "no-such-run/data: no training data" \
        in message
    (job,) = trainer_cluster.runs.values()
    assert job.restarts == 0 and len(job.pods) == 1
    assert time.monotonic() - start < 60


def test_a_failed_job_deletes_its_running_pods_and_keeps_the_failed_one(trainer_cluster, pvc):
    """kubernetes job_controller.go deletes a failed Job's active pods: node 0 still runs when
    node 1 exits 2, so node 0's pod goes and node 1's, the failed one, stays with its log."""
    program = textwrap.dedent("""
        import os, sys, time
        if os.environ["PET_NODE_RANK"] == "1":
            print("node 1: a bad flag", flush=True)
            sys.exit(2)
        time.sleep(600)
    """)
    spec = stand_in(program, nodes=2)
    from components.trainjob import launcher

    with pytest.raises(TrainJobFailed, match="FailJobSetFailurePolicyAction") as failed:
        launcher.launch(spec, trainer_cluster.namespace, "r", say=lambda _: None)
    assert "node 1: a bad flag" in str(failed.value)  # the log tail is the failed pod's
    (job,) = trainer_cluster.runs.values()
    node0, node1 = job.pods
    assert node0.deleted and node0.exit_code is not None
    assert not node1.deleted and node1.exit_code == 2


def test_the_servers_deadline_fails_a_trainjob_nobody_deletes(trainer_cluster, custom_api):
    """Trainer v2.2+: past spec.activeDeadlineSeconds the TrainJob fails (DeadlineExceeded) and
    its JobSet is deleted: the backstop when the step itself died without deleting it."""
    from components.trainjob import launcher

    spec = stand_in("import time; time.sleep(600)")
    body = launcher.build_trainjob(spec, "train-gpt-deadline", trainer_cluster.namespace, "r")
    body["spec"]["activeDeadlineSeconds"] = 2
    custom_api.create_namespaced_custom_object(GROUP, VERSION, trainer_cluster.namespace, PLURAL,
                                               body)  # fmt: skip
    job = trainer_cluster.wait_for("train-gpt-deadline")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        obj = custom_api.get_namespaced_custom_object(GROUP, VERSION, trainer_cluster.namespace,
                                                      PLURAL, "train-gpt-deadline")  # fmt: skip
        failed = launcher.conditions(obj).get("Failed")
        if failed and all(p.deleted for p in job.pods):
            break
        time.sleep(0.1)
    assert failed and failed["reason"] == "DeadlineExceeded", obj.get("status")
    assert all(p.deleted and p.exit_code is not None for p in job.pods)


@pytest.mark.skipif(not pid_namespaces(), reason="PID namespaces need root (cluster/pid1.py)")
def test_sigterm_reaches_the_stage_only_through_the_first_process(trainer_cluster):
    """A container whose first process has no SIGTERM handler (a shell, as PID 1) never hears
    of its deletion and is SIGKILLed when the grace period ends; the carry script as PID 1
    (components/trainjob/stagelog.py) passes it on, and the stage ends at once."""
    from support.cluster.render import render

    from components.trainjob import launcher

    runtime = custom_runtime(trainer_cluster)
    for command, args, stops in (
        (["sh", "-c"], ["sleep 600"], False),
        (None, ["python3", "-c", "import time; time.sleep(600)"], True),
    ):
        spec = stand_in("")
        body = launcher.build_trainjob(spec, "train-gpt-x", trainer_cluster.namespace, "r")
        trainer = body["spec"]["trainer"]
        trainer["args"] = args
        if command:
            trainer["command"] = command
        plan = render(body, runtime)
        plan.pod_spec["terminationGracePeriodSeconds"] = 2
        pod = trainer_cluster.kubelet.start(plan, 0, 0, 0)
        time.sleep(1)
        start = time.monotonic()
        trainer_cluster.kubelet.delete(pod)
        took = time.monotonic() - start
        if stops:
            assert took < 1.5 and pod.exit_code == 128 + signal.SIGTERM, (took, pod.exit_code)
        else:
            assert took >= 2 and pod.exit_code == 128 + signal.SIGKILL, (took, pod.exit_code)


def custom_runtime(cluster) -> dict:
    return cluster.api.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes",
                                                 "gpt-train-gpt")  # fmt: skip


@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_terminating_the_pipelines_running_step_leaves_nothing_running(trainer_cluster,
                                                                      custom_api, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """KFP's Terminate SIGTERMs the running step: the compiled pipeline's train-gpt step (run by
    kfp.local, as a process) deletes its TrainJob, and the TrainJob's pods end."""
    ns = trainer_cluster.namespace
    for name, value in step_env(COMPILED, ns, "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b").items():
        monkeypatch.setenv(name, value)
    # The tiny pipeline, trained until it is stopped.
    settings = {**TINY_PIPELINE, "max_iters": 100_000, "eval_interval": 100_000,
                "log_interval": 100}  # fmt: skip
    script = textwrap.dedent(f"""
        from kfp import components, local
        local.init(runner=local.SubprocessRunner(use_venv=False),
                   pipeline_root={str(tmp_path / "kfp")!r}, raise_on_error=True)
        pipeline = components.load_component_from_file({str(COMPILED)!r})
        pipeline(backend="trainjob", root="/gpt", run="terminated", **{settings!r})
    """)
    pipeline = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        job = _new_run(trainer_cluster, set(), "train-gpt")
        while "step" not in _node0_log(job, 0):
            time.sleep(0.1)
        step = _step_process(pipeline.pid)
        os.kill(step, signal.SIGTERM)
        end = time.monotonic() + 60
        while time.monotonic() < end and _trainjobs(custom_api, ns, "train-gpt-"):
            time.sleep(0.1)
        assert not _trainjobs(custom_api, ns, "train-gpt-"), "the TrainJob was left"
        end = time.monotonic() + 30
        while time.monotonic() < end and not all(p.deleted for p in job.pods):
            time.sleep(0.1)
        assert all(p.deleted and p.exit_code is not None for p in job.pods)
        assert pipeline.wait(60) != 0
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)


def _trainjobs(api, ns: str, prefix: str) -> list[str]:
    items = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    return [o["metadata"]["name"] for o in items if o["metadata"]["name"].startswith(prefix)]


def _step_process(ancestor: int) -> int:
    """The pid of kfp.local's train-gpt task, the Python running kfp.dsl.executor_main (not the
    shell around it), among the descendants of `ancestor`."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            continue
        if not ("python" in Path(argv[0]).name and "kfp.dsl.executor_main" in argv
                and "train_gpt" in argv):  # fmt: skip
            continue
        pid = int(proc.name)
        while pid > 1:
            if pid == ancestor:
                return int(proc.name)
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise LookupError("no train-gpt step process")
