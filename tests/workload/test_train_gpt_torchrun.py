"""train-gpt under torchrun: two CPU ranks (gloo), one set of files, one effective batch (two
ranks started by the local backend, as a pipeline step on one machine runs them), and recovery
from a rank that dies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.runs import (
    TINY,
    TWO_RANKS,
    as_flags,
    in_process,
    records,
    train,
    train_cli,
    write_data,
)

from components.step.dispatch import run_stage
from components.trainjob.placement import Placement
from gpt.rundir.layout import RunDir

pytestmark = pytest.mark.slow

def corpus(root: Path, run: str) -> RunDir:
    """The real load-corpus stage (in this process), char-level on the embedded default text."""
    assert in_process("load-corpus", "--root", str(root), "--run", run, "--tokenizer", "char") == 0
    return RunDir.of(root, run)


def test_two_ranks_train_the_same_effective_batch_and_write_one_set_of_files(
    root: Path, monkeypatch
) -> None:
    """Two ranks in two micro-steps each, through the local backend (the stage's torchrun
    command, as a TrainJob's container runs it), against one process and one process in
    micro-steps. (Two ranks without micro-steps against one process: the cluster's rendezvous
    test, tests/runtimes/test_train_gpt_nodes.py.)"""
    # No dropout: its masks are random draws, and ranks draw from their own streams.
    steps = {"max_iters": 8, "eval_interval": 4, "ckpt_interval": 4, "dropout": 0}
    flags = as_flags(steps)
    ddp = corpus(root, "ddp")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one thread each, as the other runs here
    said: list[str] = []
    files = run_stage("train-gpt", {"root": str(root), "run": "ddp", **TINY, **steps,
                                    "grad_accum": 2},
                      Placement(num_proc_per_node=2, timeout=300), backend="local",
                      say=said.append)  # fmt: skip
    out = "\n".join(said)
    assert out.count("done: 8 steps") == 1  # rank 0 alone reports
    assert "2 process(es) on cpu, 1 thread(s) each" in out

    recs = records(ddp)
    assert [r["step"] for r in recs] == list(range(1, 9))  # written once, not once per rank
    assert files["metrics/train.jsonl"] == ddp.train_jsonl.read_bytes()  # what the step hands on
    assert sorted(p.name for p in ddp.ckpt_dir.iterdir()) == ["LATEST", "step-4", "step-8"]
    rngs = json.loads((ddp.ckpt_step(8) / "rng.json").read_text())
    assert sorted(rngs) == ["0", "1"] and rngs["0"]["torch"] != rngs["1"]["torch"]
    assert (ddp.model_dir / "model.safetensors").is_file() and ddp.report_md.is_file()

    # One process, and one process in two micro-steps (both in this process), train on the very
    # same windows as the two ranks in micro-steps (the spelled table built once a step, its
    # gradient all-reduced in the last micro-step's backward): the losses agree up to float
    # rounding.
    corpus(root, "one")
    assert train(root, "one", *flags) == 0
    corpus(root, "accum")
    assert train(root, "accum", *flags, "--grad_accum", "2") == 0
    for run in ("one", "accum"):
        for a, b in zip(recs, records(RunDir.of(root, run)), strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (run, a["step"])
            if "val_loss" in a:
                assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4), (run, a["step"])


def test_a_rank_that_dies_is_restarted_by_torchrun_and_resumes(root: Path) -> None:
    run = write_data(root, "r")
    env = {**os.environ, "GPT_FAULT": "kill-rank-1@7"}
    # One restart is what the fault needs; a second one absorbs a gloo abort while the restarted
    # ranks connect (seen once on a loaded CI machine), as a deployment's spare restarts would.
    done = train_cli(root, "r", "--max_iters", "12", "--ckpt_interval", "5",
                     "--eval_interval", "6", env=env, torchrun=[*TWO_RANKS, "--max-restarts=2"])
    assert done.returncode == 0, done.stderr
    assert "rank 1 kills itself after step 7" in done.stderr
    assert "resumed from step-5" in done.stdout
    assert [r["step"] for r in records(run)] == list(range(1, 13))
    assert run.latest.read_text().strip() == "step-12"
    assert (run.model_dir / "model.safetensors").is_file()


def test_a_rank_that_diverges_stops_every_rank_at_the_same_check(root: Path) -> None:
    """Only rank 1's loss is NaN at step 6, but the all-reduced gradient norm is NaN on both
    ranks, so both skip the update, both stop at the next check (step 8, a log step) naming
    step 6, and neither waits forever in a collective the other never joins."""
    run = write_data(root, "r")
    env = {**os.environ, "GPT_FAULT": "nan-loss-rank-1@6"}
    done = train_cli(root, "r", "--max_iters", "12", "--ckpt_interval", "5", "--log_interval", "4",
                     env=env, torchrun=TWO_RANKS)
    assert done.returncode != 0
    assert "step 6: loss nan" in done.stderr  # rank 1's own line
    assert "step 6: loss " in done.stderr.replace("step 6: loss nan", "")  # and rank 0's
    assert "nothing after step 5 was saved" in done.stderr
    assert [r["step"] for r in records(run)] == [1, 4]
    assert run.latest.read_text().strip() == "step-5"
    assert not run.model_dir.exists()
