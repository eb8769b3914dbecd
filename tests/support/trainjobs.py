"""train-gpt, and stand-in programs in its place, as TrainJobs on the test cluster
(tests/support/cluster/).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.step.artifacts import LOSS_PNG, REPORT_MD, TRAIN_JSONL
from components.step.dispatch import run_stage
from components.trainjob.launcher import TrainJobSpec
from components.trainjob.placement import Placement
from components.trainjob.stagelog import container_command
from gpt.rundir.layout import RunDir
from support.once import made_once
from support.runs import TINY_DDP, write_data

# The train stage's files, which the step carries back from the TrainJob's log.
TRAIN_FILES = [TRAIN_JSONL, REPORT_MD, LOSS_PNG]

# A run long enough to be stopped anywhere in it, with a checkpoint halfway; a progress line
# every step says where it is.
STEPS = {"max_iters": 100, "eval_interval": 50, "ckpt_interval": 50, "log_interval": 1}


def train_on_cluster(cluster, run: str, nodes: int, procs: int, image: str = "gpt-workload:t",
                     **flags) -> dict[str, bytes]:  # fmt: skip
    """train-gpt through its component path (run_stage, backend trainjob) on `cluster`: TINY_DDP,
    with `flags` over it."""
    values = {"root": "/gpt", "run": run, **TINY_DDP, **flags}
    placement = Placement(num_nodes=nodes, num_proc_per_node=procs, timeout=120)
    return run_stage("train-gpt", values, placement, backend="trainjob", image=image,
                     namespace=cluster.namespace, say=lambda _: None)  # fmt: skip


def stand_in(program: str, name: str = "train-gpt", nodes: int = 1) -> TrainJobSpec:
    """A TrainJob of runtime gpt-train-gpt whose stage is `program` (run by the pod's Python) on
    `nodes` nodes, carrying the train stage's files of run `r` back as the component does."""
    return TrainJobSpec(
        stage=name, runtime="gpt-train-gpt", image="gpt-workload:test",
        command=container_command("/gpt/r", TRAIN_FILES),
        args=["python3", "-c", program], env={"PYTHONUNBUFFERED": "1"},
        placement=Placement(num_nodes=nodes, timeout=120),
    )  # fmt: skip


def two_nodes_uninterrupted(tmp_path_factory: pytest.TempPathFactory, cluster,
                            pvc: Path) -> dict[str, torch.Tensor]:  # fmt: skip
    """The weights of STEPS trained on two nodes and never stopped: what the tests that stop a
    two-node run compare its end with, trained on the cluster of whichever asks first."""

    def run(folder: Path) -> None:
        write_data(pvc, "whole-2")
        train_on_cluster(cluster, "whole-2", 2, 1, **STEPS)
        shutil.copy(RunDir.of(pvc, "whole-2").model_dir / "model.safetensors", folder)

    return load_file(made_once(tmp_path_factory, "two-nodes-uninterrupted", run)
                     / "model.safetensors")  # fmt: skip
