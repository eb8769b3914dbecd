"""What tests in different pytest-xdist workers compare against, made once per test session.

A module- or session-scoped fixture is made once per worker, and `make test` runs two: a
reference two tests share (a whole pipeline, say) was made twice whenever they landed on
different workers. `made_once` makes it in a folder every worker of the session sees (pytest-xdist's
documented way: the parent of a worker's base temporary folder), under a lock: the first worker
to ask makes it, and one that asks meanwhile waits for it rather than make it a second time.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = ".made"


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], None]) -> Path:  # fmt: skip
    """The folder `name` that `make(folder)` filled, made by the first worker to ask for it. A
    failed attempt leaves nothing behind that a later one would take for made."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's, shared by its workers
    folder = base / "made-once" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes, or the worker dies
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / DONE).touch()
    return folder
