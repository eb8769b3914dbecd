"""--shard (gpt/training/sharding.py, gpt/training/sharded_checkpoint.py): two gloo ranks on CPU
train as DDP's two ranks do and write sharded checkpoints, which resume on one rank and on two;
a whole checkpoint resumes on two sharded ranks. (The stop path of a sharded run:
tests/workload/training/test_stopping.py; the refusals: test_checkpoint_files.py.)

Every run here is TINY_DDP for STOPPABLE's 100 iterations (checkpoints at 50 and 100), the
runs support.runs.uninterrupted_run trains once per session and the stop tests share.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.runs import (
    STOPPABLE,
    TINY_DDP,
    TWO_RANKS,
    as_flags,
    assert_same_weights,
    model_weights,
    records,
    train,
    train_cli,
    uninterrupted_run,
)

from gpt.rundir.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.process]

FLAGS = as_flags({**TINY_DDP, **STOPPABLE})

# How far apart two runs' losses may be, relative: float32 rounding. The ranks sum their
# gradients in another order than one process does, and FSDP2's gradient norm sums its shards'
# in another order than DDP's whole gradients; over the 100 iterations the losses stay within
# 2.2e-7 of each other (measured: DDP against FSDP2 on two ranks 1.4e-7, one rank against two
# 1.8e-7, either resumed on the other number of ranks 2.1e-7), a float32's rounding (6e-8)
# but a few times.
ROUNDING = 1e-6


def assert_same_losses(got: list[dict], want: list[dict], rel: float) -> None:
    """The same steps, and each step's training (and validation) loss within `rel`."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want, strict=True):
        for key in ("loss", "val_loss"):
            assert (key in a) == (key in b), a["step"]
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=rel, abs=0), (key, a["step"])


def resumed_at_50(source: RunDir, root: Path, run: str) -> RunDir:
    """A copy of `source` (a finished run), put back to its checkpoint at step 50."""
    copy = RunDir.of(root, run)
    shutil.copytree(source.path, copy.path)
    copy.latest.write_text("step-50\n")
    shutil.rmtree(copy.ckpt_step(100))
    shutil.rmtree(copy.model_dir)
    return copy


def test_two_sharded_ranks_train_as_ddp_does_and_write_each_their_shards(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    sharded = uninterrupted_run(tmp_path_factory, 2, shard=True)
    ddp = uninterrupted_run(tmp_path_factory, 2)
    assert_same_losses(records(sharded), records(ddp), ROUNDING)
    # The export, gathered from the shards, is the plain model's.
    want = model_weights(ddp)
    for name, tensor in model_weights(sharded).items():
        assert tensor.shape == want[name].shape, name
        assert (tensor - want[name]).abs().max() < 1e-5, name
    for step in (50, 100):
        ckpt = sharded.ckpt_step(step)
        assert sorted(p.name for p in ckpt.iterdir()) == ["rng.json", "shards", "state.json"]
        assert sorted(p.name for p in (ckpt / "shards").iterdir()) == [
            ".metadata", "__0_0.distcp", "__1_0.distcp"]  # fmt: skip
    assert sharded.latest.read_text().strip() == "step-100"


def test_two_ranks_checkpoint_resumes_on_one_and_back_on_two(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys
) -> None:
    """2 -> 1: step-50 of the two sharded ranks, resumed by one process with --shard (which
    writes sharded checkpoints on) and without (whole ones from then on). 1 -> 2: the one
    process's sharded step-100, loaded by two sharded ranks, which (the run is finished) export
    what they loaded: the one process's weights, bit for bit."""
    two = uninterrupted_run(tmp_path_factory, 2, shard=True)
    for run, shard, written in (("sharded", "true", "shards"), ("plain", "false",
                                                                 "model.safetensors")):
        one = resumed_at_50(two, tmp_path, run)
        assert train(tmp_path, run, *FLAGS, "--shard", shard) == 0
        assert "resumed from step-50: step 50" in capsys.readouterr().out
        assert_same_losses(records(one), records(two), ROUNDING)
        assert (one.ckpt_step(100) / written).exists()

    one = RunDir.of(tmp_path, "sharded")
    assert sorted(p.name for p in (one.ckpt_step(100) / "shards").iterdir()) == [
        ".metadata", "__0_0.distcp"]  # fmt: skip
    exported = model_weights(one)
    shutil.rmtree(one.model_dir)
    done = train_cli(tmp_path, "sharded", *FLAGS, "--shard", "true", torchrun=TWO_RANKS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 process(es) on cpu" in done.stdout
    assert "resumed from step-100: step 100" in done.stdout
    assert_same_weights(model_weights(one), exported, "one process's, loaded by two ranks")


def test_a_whole_checkpoint_resumes_on_two_sharded_ranks(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """1 -> 2 from a whole checkpoint (one process without --shard): rank 0 reads its files and
    sends every rank its shards of the weights and AdamW's state; training goes on as the one
    process did."""
    one = uninterrupted_run(tmp_path_factory, 1)
    two = resumed_at_50(one, tmp_path, "two")
    done = train_cli(tmp_path, "two", *FLAGS, "--shard", "true", torchrun=TWO_RANKS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from step-50: step 50" in done.stdout
    assert_same_losses(records(two), records(one), ROUNDING)
    assert sorted(p.name for p in (two.ckpt_step(100) / "shards").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # fmt: skip
