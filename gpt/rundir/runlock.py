"""One writer per run directory: the lock a stage holds while it runs.

Two pipelines started on the same `--run` must not both write it: the first takes the lock, the
second fails at once with one line naming the busy run. The lock is `flock` on
`<root>/.<run>.lock`, so the kernel releases it when its holder dies, however it dies: a run
killed with SIGKILL never leaves a stale lock, and the next attempt sweeps away what the killed
writers left half-done (gpt/rundir/atomic.py's `sweep`) before it writes anything.

A holder that starts the stages as child processes (the local pipeline) names its lock in
GPT_RUN_LOCK; a stage that finds its run's lock held under that name runs under it. Under
torchrun only global rank 0 takes the lock: it alone writes files, and the other ranks die with
it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from gpt.errors import InputError
from gpt.rundir import atomic
from gpt.rundir.layout import RunDir

LOCK_ENV = "GPT_RUN_LOCK"


class RunBusy(InputError):
    """Another process holds the run's lock."""


def lock_path(rundir: RunDir) -> Path:
    # Beside the run directory, not in it: taking the lock writes nothing into a run that bad
    # input then refuses, and the file is removed again when the lock is released.
    return rundir.lock


def _try_lock(path: Path) -> int | None:
    """An fd holding the exclusive lock on `path`, or None if another process holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:  # a read-only or foreign root: say so, not a traceback
            raise InputError(f"--root {str(path.parent)!r}: cannot create the run lock "
                             f"{path.name}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        # The previous holder unlinks the file as it lets go: if it did so between our open and
        # our flock, we hold a lock on a file nobody else will open; take the new one instead.
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError):
        if text := path.read_text().strip():
            return text
    return "another process"


@contextlib.contextmanager
def hold(rundir: RunDir, holder: str) -> Iterator[None]:
    """Hold `rundir`'s lock for the block (or run under the lock of the process that started us);
    raise RunBusy naming the run if another process holds it."""
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: it writes nothing
        yield
        return
    path = lock_path(rundir)
    try:
        rundir.root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"--root {str(rundir.root)!r}: cannot create it: {e.strerror or e}"
        ) from None
    fd = _try_lock(path)
    if fd is None:
        if os.environ.get(LOCK_ENV) == str(path.resolve()):
            yield  # our parent holds it for us
            return
        raise RunBusy(f"--run {rundir.run_id!r} is busy: {_holder(path)} holds {path}; wait for it "
                      "to finish, or stop it")
    try:
        os.ftruncate(fd, 0)
        with atomic.writing(path, "the run lock"):
            os.write(fd, f"{holder} (pid {os.getpid()} on {socket.gethostname()})\n".encode())
        atomic.sweep(rundir.path)
        atomic.sweep(rundir.root, rundir.run_id)  # scratch_dir's beside the run directory
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the unlock: a waiter then never locks a file about to vanish
        os.close(fd)


def environment_for_children(rundir: RunDir) -> dict[str, str]:
    """The variable that lets the stages a lock holder starts run under its lock."""
    return {LOCK_ENV: str(lock_path(rundir).resolve())}
