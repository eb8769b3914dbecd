"""Fault injection for the crash tests; does nothing unless GPT_FAULT is set.

Crash safety is only believable if a test can crash the trainer at the worst moment. GPT_FAULT
names one fault:

- `stall-checkpoint@N`: the writer of checkpoint step-N stops after writing its files and before
  publishing them (rename + LATEST), and waits there to be killed.
- `kill-rank-R@N`: rank R kills itself with SIGKILL after iteration N, on the first attempt
  only (torchrun's TORCHELASTIC_RESTART_COUNT is 0), so `torchrun --max-restarts` can recover.
- `nan-loss-rank-R@N`: rank R's loss in iteration N is NaN, as if that rank diverged.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch


def _fault(kind: str) -> int | None:
    """The iteration of fault `kind` if GPT_FAULT names it."""
    name, _, iteration = os.environ.get("GPT_FAULT", "").partition("@")
    return int(iteration) if name == kind else None


def checkpoint_staged(iteration: int) -> None:
    if _fault("stall-checkpoint") == iteration:
        print(f"GPT_FAULT: stalling inside the write of checkpoint step-{iteration}", flush=True)
        while True:
            time.sleep(1)


def iteration_done(iteration: int, rank: int) -> None:
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if _fault(f"kill-rank-{rank}") == iteration and first_attempt:
        print(f"GPT_FAULT: rank {rank} kills itself after step {iteration}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def loss_of(loss: torch.Tensor, iteration: int, rank: int) -> torch.Tensor:
    if _fault(f"nan-loss-rank-{rank}") == iteration:
        return loss * float("nan")
    return loss
