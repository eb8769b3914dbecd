"""The local backend runs a stage as the TrainJob would: torchrun with several processes too."""

from __future__ import annotations

import json
from pathlib import Path

from support.runs import TINY, write_data

from components.step.dispatch import run_stage
from components.trainjob.placement import Placement


def test_train_under_torchrun_with_two_processes_through_the_local_backend(root: Path) -> None:
    rundir = write_data(root, "ddp-local")
    files = run_stage(
        "train-gpt",
        {"root": str(root), "run": "ddp-local", **TINY, "max_iters": 4, "eval_interval": 4},
        Placement(num_proc_per_node=2, timeout=300),
        backend="local",
        say=lambda line: None,
    )
    lines = [json.loads(x) for x in files["metrics/train.jsonl"].decode().splitlines()]
    assert lines[-1]["step"] == 4
    assert (rundir.model_dir / "model.safetensors").is_file()
