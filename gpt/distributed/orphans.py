"""No orphans: a child process that must not outlive its parent.

A stage killed with SIGKILL cannot stop its children. torchrun starts every rank in a session of
its own, and the local backend starts each stage in one too, so without this a rank or a stage
would go on writing the run directory after the pipeline that started it was killed, beside the
re-run that now holds the run's lock.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # the parent died before the request took hold
        os.kill(os.getpid(), signal.SIGKILL)
