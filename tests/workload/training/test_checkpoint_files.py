"""Checkpoints survive a crash mid-write, and a malicious or damaged one is refused."""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.runs import ONE_THREAD, TINY_FLAGS, records, train, write_data

from gpt.training import checkpoint_files


class Payload:
    """Unpickling this runs code: it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickle_payload_in_a_checkpoint_is_refused_and_nothing_runs(root: Path, capsys,
                                                                       tmp_path: Path) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    marker = tmp_path / "payload-ran"
    evil = run.ckpt_step(4) / checkpoint_files.OPTIMIZER
    torch.save({"state": {}, "param_groups": [], "extra": Payload(marker)}, evil)
    torch.load(evil, weights_only=False)  # the payload is live: a plain load runs it
    assert marker.exists()
    marker.unlink()
    before = run.train_jsonl.read_text()
    capsys.readouterr()

    assert train(root, "r", "--max_iters", "8") == 2
    err = capsys.readouterr().err
    assert "optimizer.pt: refused" in err and "it would call" in err and err.count("\n") == 1
    assert not marker.exists()
    assert run.train_jsonl.read_text() == before  # no step was trained
    assert run.latest.read_text().strip() == "step-4"


def test_a_pickle_payload_in_a_sharded_checkpoint_is_refused_and_nothing_runs(
    root: Path, capsys, tmp_path: Path
) -> None:
    """DCP pickles a sharded checkpoint's shards/.metadata (--shard); it is read by an unpickler
    that builds DCP's metadata classes alone (gpt/training/sharded_checkpoint.py)."""
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4", "--shard", "true") == 0
    ckpt = run.ckpt_step(4)
    assert sorted(p.name for p in ckpt.iterdir()) == ["rng.json", "shards", "state.json"]
    marker = tmp_path / "payload-ran"
    (ckpt / "shards" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    before = run.train_jsonl.read_text()
    capsys.readouterr()

    assert train(root, "r", "--max_iters", "8", "--shard", "true") == 2
    err = capsys.readouterr().err
    assert "shards: refused, it holds Python objects" in err and "pathlib.Path.touch" in err
    assert err.count("\n") == 1
    assert not marker.exists()
    assert run.train_jsonl.read_text() == before  # no step was trained


def test_a_truncated_shard_or_missing_metadata_is_a_clear_error(root: Path, capsys) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4", "--shard", "true") == 0
    shard = run.ckpt_step(4) / "shards" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "8", "--shard", "true") == 2
    err = capsys.readouterr().err
    assert "shards: truncated or corrupt" in err and err.count("\n") == 1
    (run.ckpt_step(4) / "shards" / ".metadata").unlink()
    assert train(root, "r", "--max_iters", "8", "--shard", "true") == 2
    assert "names step-4, which lacks shards/.metadata" in capsys.readouterr().err


@pytest.mark.parametrize("name", [checkpoint_files.MODEL, checkpoint_files.OPTIMIZER,
                                  checkpoint_files.STATE])
def test_a_truncated_checkpoint_is_a_clear_error(root: Path, capsys, name: str) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    path = run.ckpt_step(4) / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "8") == 2
    err = capsys.readouterr().err
    assert f"{name}: truncated or corrupt checkpoint file" in err and err.count("\n") == 1


def test_latest_naming_a_missing_checkpoint_is_a_clear_error(root: Path, capsys) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    run.latest.write_text("step-3\n")
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "8") == 2
    assert "names step-3, which lacks model.safetensors" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("shard", [False, True], ids=["whole", "sharded"])
def test_sigkill_during_a_checkpoint_write_keeps_latest_on_the_previous_one(root: Path,
                                                                            shard: bool) -> None:
    """A whole checkpoint, or a sharded one (--shard: its shards by DCP, then state.json and
    rng.json, in the same staging folder)."""
    run = write_data(root, "r")
    flags = ["--max_iters", "15", "--ckpt_interval", "5", "--keep_last", "5",
             "--eval_interval", "5", "--shard", str(shard).lower()]
    cmd = [sys.executable, "-m", "gpt", "train-gpt", "--root", str(root), "--run", "r", *TINY_FLAGS,
           *flags]
    env = {**os.environ, **ONE_THREAD, "GPT_FAULT": "stall-checkpoint@10"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        for line in proc.stdout:
            if "stalling inside the write of checkpoint step-10" in line:
                break
        else:
            pytest.fail("the trainer never reached the stall in checkpoint step-10")
        # the files of step-10 are written (to a staging directory) but not yet published
        written = "shards/__0_0.distcp" if shard else "model.safetensors"
        assert list(run.ckpt_dir.glob(f".step-10.*.staging/{written}"))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert run.latest.read_text().strip() == "step-5"
    assert not run.ckpt_step(10).exists()

    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                             env={**os.environ, **ONE_THREAD})
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step-5" in resumed.stdout
    assert [r["step"] for r in records(run)] == list(range(1, 16))
    assert run.latest.read_text().strip() == "step-15"
    assert not list(run.ckpt_dir.glob(".step-*"))  # the cut-off write was cleaned up
    assert (run.model_dir / "model.safetensors").is_file()
