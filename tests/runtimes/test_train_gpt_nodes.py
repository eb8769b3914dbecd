"""train-gpt as a multi-node TrainJob on the test cluster: torchrun's rendezvous on the Trainer's
PET_* env across node pods, its progress in the TrainJob's status, and a node lost (JobSet
restarts, then no restarts left)."""

from __future__ import annotations

import copy
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from support.apiserver import apply_cluster_object
from support.cluster.controller import SYNC_BATCH_S
from support.cluster.render import TRAINJOB_STATUS
from support.paths import PROJECT
from support.runs import (
    STOPPABLE,
    TINY_DDP,
    as_flags,
    assert_same_weights,
    model_weights,
    records,
    train,
    uninterrupted,
    write_data,
)
from support.trainjobs import train_on_cluster

from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobFailed
from gpt.rundir.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.apiserver]

# Two nodes of two processes: the rendezvous across nodes and within each. Two nodes of one
# process each, the shape the lost-node and eviction tests train, end as two ranks on one
# machine do (those tests compare them with support.runs.uninterrupted); it ran here
# too until its half a minute was wanted back (issue 44: make test).
#
# The Trainer runs with the TrainJobStatus gate here: rank 0 posts its progress (issue 59).
@pytest.mark.parametrize("nodes,procs", [(2, 2)])
@pytest.mark.parametrize("trainer_feature_gates", [frozenset({TRAINJOB_STATUS})],
                         ids=[TRAINJOB_STATUS])  # fmt: skip
def test_nodes_train_through_the_rendezvous_as_one_process_would(
    nodes, procs, pvc, trainer_cluster
):
    steps = {"max_iters": 8, "eval_interval": 4, "ckpt_interval": 4}
    write_data(pvc, "ddp")
    said: list[str] = []
    train_on_cluster(trainer_cluster, "ddp", nodes, procs, say=said.append, **steps)
    (run,) = trainer_cluster.runs.values()
    last = [p for p in run.pods if p.attempt == run.restarts]
    if run.restarts:
        # The runtime's failurePolicy restarted the JobSet (a CI machine has done so once, the
        # cause unseen): say why in the test report, then check the attempt that completed.
        warnings.warn(f"JobSet restarted {run.restarts} time(s); first failed attempt's logs:\n"
                      + "\n".join(f"--- {p.name}\n{p.log[-3000:]}" for p in run.pods
                                   if p.attempt == 0), stacklevel=1)
    assert [p.index for p in last] == list(range(nodes))
    assert all(p.env["PET_NNODES"] == str(nodes) for p in last)
    node0, node1 = (p.log for p in last)
    assert f"{nodes * procs} process(es) on cpu" in node0
    assert node0.count("done: 8 steps") == 1 and "done: 8 steps" not in node1  # rank 0 alone
    assert_progress_in_the_trainjobs_status(trainer_cluster, run.trainjob, said)

    ddp = records(RunDir.of(pvc, "ddp"))
    assert [r["step"] for r in ddp] == list(range(1, 9))  # written once, by rank 0
    write_data(pvc, "one")
    assert train(pvc, "one", *as_flags({**TINY_DDP, **steps})) == 0
    for a, b in zip(ddp, records(RunDir.of(pvc, "one")), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]


def assert_progress_in_the_trainjobs_status(cluster, trainjob: dict, said: list[str]) -> None:
    """The run's status.trainerStatus moved while it trained, as the step's log says (once per
    change, from the launcher's watch), and reached 100% before the TrainJob completed, with the
    last validation; rank 0 alone posted, each post taken."""
    meta = trainjob["metadata"]
    seen = [line for line in said if " trainerStatus: " in line]
    complete = next(i for i, line in enumerate(said) if " complete after " in line)
    assert len(seen) >= 2 and "loss " in seen[0], said
    assert not seen[0].split(" trainerStatus: ")[1].startswith("100%"), seen
    assert "100% done, about 0 s left" in seen[-1] and said.index(seen[-1]) < complete, said
    final = cluster.api.get_namespaced_custom_object(
        GROUP, VERSION, meta["namespace"], PLURAL, meta["name"])["status"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    assert metrics["step"] == "8" and float(metrics["val_bpb"]) > 0, metrics
    assert datetime.strptime(final["lastUpdatedTime"], "%Y-%m-%dT%H:%M:%SZ")
    codes = [code for code, _ in cluster.status_server.requests]
    assert codes and set(codes) == {200}, codes


def lose_node_after_checkpoint(cluster, pvc: Path, run: str, index: int) -> threading.Thread:
    """A thread that SIGKILLs node `index` of the train TrainJob once ckpt/LATEST exists."""

    def kill() -> None:
        latest = RunDir.of(pvc, run).latest
        job = cluster.wait_for("train-gpt-")
        while not latest.exists():
            time.sleep(0.01)
        job.lose_node(index)
        killed_at.append(time.monotonic())

    killed_at: list[float] = []
    thread = threading.Thread(target=kill, daemon=True)
    thread.killed_at = killed_at
    thread.start()
    return thread


LONG = {"max_iters": 60, "eval_interval": 30, "ckpt_interval": 10}


def test_a_lost_node_restarts_the_jobset_and_training_ends_as_if_uninterrupted(
    pvc, trainer_cluster, tmp_path_factory
):
    write_data(pvc, "lost")
    killer = lose_node_after_checkpoint(trainer_cluster, pvc, "lost", 1)
    train_on_cluster(trainer_cluster, "lost", 2, 1, **STOPPABLE)
    killer.join(5)
    (run,) = trainer_cluster.runs.values()
    assert run.restarts == 1, "the node was lost after training ended: make STOPPABLE longer"
    assert "resumed from step-" in run.current[0].log
    assert [r["step"] for r in records(RunDir.of(pvc, "lost"))][-1] == STOPPABLE["max_iters"]

    lost = model_weights(RunDir.of(pvc, "lost"))
    assert_same_weights(lost, uninterrupted(tmp_path_factory, 2))


def recreate(api, runtime: dict) -> None:
    """Delete and create `runtime` again: its failurePolicy is immutable (a CEL rule)."""
    name = runtime["metadata"]["name"]
    api.delete_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)
    apply_cluster_object(api, runtime)


def test_without_restarts_left_the_step_fails_at_once_and_a_rerun_resumes(
    pvc, trainer_cluster
):
    runtime = yaml.safe_load((PROJECT / "runtimes/gpt-train-gpt.yaml").read_text())
    strict = copy.deepcopy(runtime)
    strict["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] = 0
    recreate(trainer_cluster.api, strict)
    try:
        write_data(pvc, "r")
        killer = lose_node_after_checkpoint(trainer_cluster, pvc, "r", 1)
        with pytest.raises(TrainJobFailed) as err:
            train_on_cluster(trainer_cluster, "r", 2, 1, **LONG)
        failed_at = time.monotonic()
    finally:
        recreate(trainer_cluster.api, runtime)
    # At once: the JobSet's failure ends the step, where the surviving node alone would wait in
    # its next all-reduce for the process group's 30-minute timeout. (Seconds, not the Job's
    # one-second sync: the bound must hold on a busy machine too.)
    assert failed_at - killer.killed_at[0] < SYNC_BATCH_S + 15
    text = str(err.value)
    assert "ReachedMaxRestarts: jobset failed due to reaching max number of restarts" in text
    assert "Log tail:" in text

    # The same run again (a pipeline re-run): it resumes from the checkpoint the lost run left.
    latest = RunDir.of(pvc, "r").latest.read_text().strip()
    train_on_cluster(trainer_cluster, "r", 2, 1, **LONG)
    rerun = list(trainer_cluster.runs.values())[-1]
    assert f"resumed from {latest}" in rerun.current[0].log
