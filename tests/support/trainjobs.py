"""train-gpt, and stand-in programs in its place, as TrainJobs on the test cluster
(tests/support/cluster/).
"""

from __future__ import annotations

from collections.abc import Callable

from components.step.artifacts import LOSS_PNG, REPORT_MD, TRAIN_JSONL
from components.step.dispatch import run_stage
from components.trainjob.launcher import TrainJobSpec
from components.trainjob.placement import Placement
from components.trainjob.stagelog import container_command
from support.runs import TINY_DDP

# The train stage's files, which the step carries back from the TrainJob's log.
TRAIN_FILES = [TRAIN_JSONL, REPORT_MD, LOSS_PNG]


def train_on_cluster(cluster, run: str, nodes: int, procs: int, image: str = "gpt-workload:t",
                     say: Callable[[str], None] = lambda _: None,
                     **flags) -> dict[str, bytes]:  # fmt: skip
    """train-gpt through its component path (run_stage, backend trainjob) on `cluster`: TINY_DDP,
    with `flags` over it; `say` gets the step's log lines."""
    values = {"root": "/gpt", "run": run, **TINY_DDP, **flags}
    placement = Placement(num_nodes=nodes, num_proc_per_node=procs, timeout=120)
    return run_stage("train-gpt", values, placement, backend="trainjob", image=image,
                     namespace=cluster.namespace, say=say)  # fmt: skip


def stand_in(program: str, name: str = "train-gpt", nodes: int = 1) -> TrainJobSpec:
    """A TrainJob of runtime gpt-train-gpt whose stage is `program` (run by the pod's Python) on
    `nodes` nodes, carrying the train stage's files of run `r` back as the component does."""
    return TrainJobSpec(
        stage=name, runtime="gpt-train-gpt", image="gpt-workload:test",
        command=container_command("/gpt/r", TRAIN_FILES),
        args=["python3", "-c", program], env={"PYTHONUNBUFFERED": "1"},
        placement=Placement(num_nodes=nodes, timeout=120),
    )  # fmt: skip
