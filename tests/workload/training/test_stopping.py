"""SIGTERM is a checkpoint, not a loss (gpt/training/stopping.py): on one machine, one process and
torchrun.

The cluster's side (the signal reaching the trainer in a pod, the Job's failure policy) is
tests/runtimes/test_train_gpt_stops.py.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from support.runs import (
    DEFAULT_FLAGS,
    ONE_THREAD,
    STOPPABLE,
    TINY_DDP,
    as_flags,
    assert_same_weights,
    default_flags_run,
    model_weights,
    train,
    uninterrupted,
    write_data,
)

from gpt.errors import EXIT_FATAL, EXIT_STOPPED
from gpt.rundir.layout import RunDir
from gpt.stages import TRAIN_GPT
from gpt.training.stopping import StopRequest

# Long enough to be signalled mid-run, short enough for CI: a few seconds of a tiny model; the
# run support.runs.uninterrupted trained, which one or two ranks stopped here end with.
FLAGS = as_flags({**TINY_DDP, **STOPPABLE})


def _command(root: Path, run: str, nproc: int, shard: bool = False) -> list[str]:
    torchrun = None
    if nproc > 1:
        torchrun = [sys.executable, "-m", "gpt.distributed.torchrun", "--standalone",
                    "--nproc_per_node", str(nproc)]
    flags = [*FLAGS, "--shard", "true"] if shard else FLAGS
    return TRAIN_GPT.command(["--root", str(root), "--run", run, *flags],
                             python=[sys.executable], torchrun=torchrun)


def _signal_mid_run(root: Path, run: str, nproc: int, after_step: int,
                    shard: bool = False) -> tuple[int, str]:  # fmt: skip
    """Start the run, SIGTERM it once its log shows step `after_step`; its status and log."""
    proc = subprocess.Popen(_command(root, run, nproc, shard), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **ONE_THREAD})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.match(r"step\s+(\d+)/", line)
        if m and int(m.group(1)) >= after_step:
            proc.send_signal(signal.SIGTERM)
            break
    lines.extend(proc.stdout)
    return proc.wait(timeout=120), "".join(lines)


def test_the_first_signal_is_noted_and_a_second_stops_at_once() -> None:
    with StopRequest("prog") as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGINT)
        assert stop.signal == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
@pytest.mark.parametrize("nproc, shard", [(1, False), (2, False), (2, True)],
                         ids=["one", "two", "two-sharded"])
def test_sigterm_writes_a_checkpoint_and_the_rerun_resumes_bit_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, nproc: int, shard: bool
) -> None:
    """At a random step, with one process and under torchrun (gpt.distributed.torchrun), DDP or
    sharded (--shard: every rank writes its shards of the checkpoint): the status says stopped,
    LATEST is the step it stopped at (no step after the last logged one is lost), and the same
    command then ends with the weights of an uninterrupted run."""
    whole = uninterrupted(tmp_path_factory, nproc, shard)
    write_data(tmp_path, "stopped")
    # Each CI run draws anew; the last draw leaves 50 steps for the signal to land in.
    after = random.Random().choice(range(10, 60, 10))
    status, log = _signal_mid_run(tmp_path, "stopped", nproc, after, shard)
    assert status == EXIT_STOPPED, log[-2000:]
    stopped = re.search(rf"stopped by SIGTERM at step (\d+) of {STOPPABLE['max_iters']}, "
                        "checkpoint written", log)  # fmt: skip
    assert stopped, log[-2000:]
    step = int(stopped.group(1))
    assert step >= after
    rundir = RunDir.of(tmp_path, "stopped")
    assert rundir.latest.read_text().strip() == f"step-{step}"
    assert "Traceback" not in log
    if shard:  # each rank wrote its own part
        shards = rundir.ckpt_step(step) / "shards"
        assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp",
                                                             "__1_0.distcp"]  # fmt: skip
    again = subprocess.run(_command(tmp_path, "stopped", nproc, shard), capture_output=True,
                           text=True, env={**os.environ, **ONE_THREAD}, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from step-{step}: step {step}" in again.stdout
    assert_same_weights(model_weights(rundir), whole, f"stopped at {step}")


@pytest.mark.slow
def test_checkpoints_by_the_clock_leave_the_weights_unchanged(tmp_path: Path) -> None:
    """--ckpt_interval_s adds checkpoints as time passes; what is trained stays the same."""
    for run in ("steps", "clock"):
        write_data(tmp_path, run)
    flags = ["--max_iters", "60", "--ckpt_interval", "1000", "--keep_last", "100"]
    assert train(tmp_path, "steps", *flags, "--ckpt_interval_s", "0") == 0
    assert train(tmp_path, "clock", *flags, "--ckpt_interval_s", "0.02") == 0
    steps, clock = RunDir.of(tmp_path, "steps"), RunDir.of(tmp_path, "clock")
    assert [p.name for p in steps.ckpt_dir.glob("step-*")] == ["step-60"]
    assert len(list(clock.ckpt_dir.glob("step-*"))) > 2
    assert_same_weights(model_weights(steps), model_weights(clock))


@pytest.mark.slow
def test_a_bad_flag_under_torchrun_exits_fatal_with_one_line(tmp_path: Path) -> None:
    """torchrun alone would exit 1 with a traceback; the runtime's podFailurePolicy needs 2."""
    write_data(tmp_path, "r")
    cmd = _command(tmp_path, "r", 2) + ["--batch_size", "7"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, **ONE_THREAD})
    assert out.returncode == EXIT_FATAL, out.stderr[-2000:]
    assert "--batch_size 7: must split evenly over 2 process(es)" in out.stderr
    assert "torchrun: a worker exited with status 2" in out.stderr


@pytest.mark.slow
def test_with_the_default_flags_a_sigterm_resumes_bit_identical(tmp_path: Path,
                                                                 tmp_path_factory) -> None:
    """What the README says, with the default model and recipe (support.runs.DEFAULT_FLAGS, as
    tests/workload/test_train_gpt.py's default-flags test): SIGTERM at a random step, then the
    same command, gives the weights of the run that was never stopped (the default-flags run both
    compare with)."""
    write_data(tmp_path, "stopped")
    command = [sys.executable, "-m", "gpt", "train-gpt", "--root", str(tmp_path), "--run",
               "stopped", *DEFAULT_FLAGS, "--log_interval", "1"]
    env = {**os.environ, **ONE_THREAD}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    after = random.Random().randrange(2, 36)
    for line in proc.stdout:
        if (m := re.match(r"step\s+(\d+)/", line)) and int(m.group(1)) >= after:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stdout.read()
    assert proc.wait(120) == EXIT_STOPPED, rest
    assert "checkpoint written" in rest
    again = subprocess.run(command, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "resumed from step-" in again.stdout
    stopped = model_weights(RunDir.of(tmp_path, "stopped"))
    assert_same_weights(stopped, model_weights(default_flags_run(tmp_path_factory)))


@pytest.mark.process
def test_a_rank_waiting_for_its_peers_ends_at_the_first_sigterm(tmp_path: Path) -> None:
    """Rank 1 of 2, whose rank 0 never comes (the pod that replaced an evicted one while the
    other node was leaving): SIGTERM ends it at once, as if no checkpoint were pending. Noted
    instead, it would wait in init_process_group until the SIGKILL, holding its pod."""
    write_data(tmp_path, "r")
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    env = {**os.environ, **ONE_THREAD, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port)}
    proc = subprocess.Popen(_command(tmp_path, "r", 1), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        end = time.monotonic() + 60
        while store.num_keys() == 0 and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)  # until rank 1 has written its address and waits for rank 0's
        assert store.num_keys() > 0, proc.communicate(timeout=5)[0][-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
