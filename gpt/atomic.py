"""Atomic file and directory writes: another stage (or a restarted one) never sees half a file.

Every writer goes to a temporary name in the destination's directory, is flushed and fsynced, then
renamed over the destination; the directory is fsynced so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; on success it replaces `dest`, on error it vanishes.

    For writers that want a filename (numpy, safetensors, torch.save).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    # mkstemp makes 0600; the next stage may run as another uid (same fsGroup) on the shared
    # volume, so give the file the permissions an ordinary open() would.
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _fsync_file(tmp_path)
        os.replace(tmp_path, dest)
        fsync_dir(dest.parent)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_bytes(dest: Path | str, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def write_text(dest: Path | str, text: str) -> None:
    write_bytes(dest, text.encode("utf-8"))


def write_json(dest: Path | str, obj: Any) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def append_jsonl(dest: Path | str, obj: Any) -> None:
    """Append one JSON line with a single write, then fsync: a crash loses at most that line."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged_dir(dest: Path | str) -> Iterator[Path]:
    """Yield an empty staging directory next to `dest`; on success it becomes `dest`.

    An existing `dest` is replaced only after the new one is complete; on error the staging
    directory is removed and `dest` is left as it was.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".staging", dir=dest.parent))
    stage.chmod(0o777 & ~_umask())  # mkdtemp makes 0700: see atomic_path
    try:
        yield stage
        for f in stage.rglob("*"):
            if f.is_file():
                _fsync_file(f)
        fsync_dir(stage)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
            os.replace(stage, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, dest)
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


@contextlib.contextmanager
def scratch_dir(near: Path | str) -> Iterator[Path]:
    """Yield an empty working directory beside `near` (not in it: `near` need not exist yet),
    removed when the block ends, however it ends. Files made there reach their place by
    os.replace (same filesystem); one a kill leaves behind is swept like staged_dir's."""
    near = Path(near)
    near.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{near.name}.", suffix=".staging", dir=near.parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


# What a writer cut off mid-write leaves next to its destination `<dest>`: atomic_path's
# `.<dest>.<random>.tmp`, staged_dir's `.<dest>.<random>.staging` and `.<dest>.old`.
_LEFTOVER = re.compile(r"^\.(?P<dest>.+)\.(?:[a-z0-9_]{8}\.(?:tmp|staging)|(?P<old>old))$")


def sweep(top: Path | str, dest: str | None = None) -> list[Path]:
    """Remove what killed writers left under `top` (only that of `dest`, if given, and then in
    `top` alone); returns what was removed or restored.

    Only safe while no writer is at work there (the run lock, gpt/runlock.py, sees to that). A
    staged_dir cut off between its two renames left `.<dest>.old` and no `<dest>`: the old
    directory is put back, so `top` holds what it held before that write began.
    """
    top = Path(top)
    if not top.is_dir():
        return []
    found = top.glob(f".{glob.escape(dest)}.*") if dest else top.rglob(".*")
    touched: list[Path] = []
    for path in sorted(found, key=lambda p: len(p.parts)):
        m = _LEFTOVER.match(path.name)
        if not m or (dest and m["dest"] != dest) or not os.path.lexists(path):
            continue  # not ours, or gone with a removed parent
        original = path.with_name(m["dest"])
        if m["old"] and not original.exists():
            os.replace(path, original)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        touched.append(path)
        fsync_dir(path.parent)
    return touched
