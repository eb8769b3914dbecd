"""Stopping on request: SIGTERM (or Ctrl-C) becomes a checkpoint, not a loss.

A cluster stops a pod by SIGTERM, then SIGKILL after the pod's grace period: a drained or
preempted node, a deleted TrainJob, KFP's Terminate. Training answers the first SIGTERM or
SIGINT at the end of the iteration it is in: every rank stops at the same iteration, a
checkpoint is written there, and the stage exits with EXIT_STOPPED (gpt/errors.py), so running
the same command again resumes bit-exactly. A second signal stops at once, as the signal always did.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """Training stopped on request after writing a checkpoint; the message says where."""


class StopRequest:
    """While entered, notes the first SIGTERM/SIGINT instead of dying of it (main thread only)."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.signal: signal.Signals | None = None
        """The signal that asked to stop, once one did."""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:  # asked twice: stop now, as without us
            self._restore()
            signal.raise_signal(signum)
            return
        self.signal = signal.Signals(signum)
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank is told: say it once
                print(f"{self.prog}: {self.signal.name}: stopping after this step, with a "
                  "checkpoint (a second signal stops at once)", file=sys.stderr, flush=True)

    @property
    def requested(self) -> bool:
        return self.signal is not None
