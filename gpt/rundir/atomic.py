"""Atomic file and directory writes: another stage (or a restarted one) never sees half a file.

Every writer goes to a temporary name in the destination's directory, is flushed and fsynced, then
renamed over the destination; the directory is fsynced so the rename itself survives a crash.

A full volume (or a spent quota) is the one failure a person can act on, so every writer here
says what it was writing (`what`), and turns running out of space into `DiskFull` naming the
destination and that: one line from the CLI instead of a library's traceback. By then its
temporary files are gone, so what was there before the write is all that is left.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt.errors import DiskFull


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


def _shareable(path: Path) -> None:
    """Give `path` the mode an ordinary open() or mkdir() would (0644 / 0755 under umask 022).

    The next stage, a notebook or a model server may run as another uid (same fsGroup) on the
    shared volume. Temporary names are made private (mkstemp 0600, mkdtemp 0700), and some writers
    make their own private temporary file and rename it over ours (safetensors >= 0.6 does), so
    the mode is set again once the writer is done.
    """
    default = 0o777 if path.is_dir() else 0o666
    path.chmod(default & ~_umask())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# safetensors' writer (Rust) raises its own exception type and keeps the OS error only in its
# message: "Error while serializing: I/O error: No space left on device (os error 28)".
_OS_ERROR_IN_MESSAGE = re.compile(r"\(os error (\d+)\)")


def _out_of_space(e: BaseException | None) -> bool:
    """Whether `e`, or an exception it was raised in handling, says the volume is out of space:
    torch's zip writer, when Python's write of its data failed, fails again closing the file
    ("unexpected pos") with the OSError as its context."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            if e.errno in _NO_SPACE:
                return True
        elif (found := _OS_ERROR_IN_MESSAGE.search(str(e))) and int(found[1]) in _NO_SPACE:
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def writing(path: Path | str, what: str) -> Iterator[None]:
    """Raise DiskFull naming `path` and `what` if the block runs out of space (for writers that do
    not go through this module's)."""
    try:
        yield
    except DiskFull:
        raise  # named already, by the writer inside that ran out
    except Exception as e:
        if not _out_of_space(e):
            raise
        raise DiskFull(path, what) from e


@contextlib.contextmanager
def atomic_path(dest: Path | str, *, what: str) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; on success it replaces `dest`, on error it vanishes.

    For writers that want a filename (numpy, safetensors, torch.save).
    """
    dest = Path(dest)
    with writing(dest, what):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            yield tmp_path
            _shareable(tmp_path)
            _fsync_file(tmp_path)
            os.replace(tmp_path, dest)
            fsync_dir(dest.parent)
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise


def write_bytes(dest: Path | str, data: bytes, *, what: str) -> None:
    with atomic_path(dest, what=what) as tmp:
        tmp.write_bytes(data)


def write_text(dest: Path | str, text: str, *, what: str) -> None:
    write_bytes(dest, text.encode("utf-8"), what=what)


def write_json(dest: Path | str, obj: Any, *, what: str) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n", what=what)


def append_jsonl(dest: Path | str, obj: Any, *, what: str) -> None:
    """Append one JSON line and fsync: a crash loses at most that line, and a full volume none of
    what was there (a line cut short is cut off again)."""
    dest = Path(dest)
    line = (json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    with writing(dest, what):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # as open() does
        try:
            end = os.fstat(fd).st_size
            try:
                # One write, nearly always; a volume filling up takes part of it and refuses
                # the rest on the next.
                left = memoryview(line)
                while left:
                    left = left[os.write(fd, left):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, end)  # shrinking needs no space
                raise
        finally:
            os.close(fd)


@contextlib.contextmanager
def staged_dir(dest: Path | str, *, what: str) -> Iterator[Path]:
    """Yield an empty staging directory next to `dest`; on success it becomes `dest`.

    An existing `dest` is replaced only after the new one is complete; on error the staging
    directory is removed and `dest` is left as it was. A DiskFull from a writer inside names the
    file by its place in `dest`: the staging directory is gone by the time anyone reads it.
    """
    dest = Path(dest)
    with writing(dest, what):
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".staging", dir=dest.parent))
        try:
            try:
                yield stage
            except DiskFull as e:
                if stage not in e.path.parents:
                    raise
                raise DiskFull(dest / e.path.relative_to(stage), e.what) from e
            for f in [stage, *stage.rglob("*")]:
                if f.is_symlink():
                    continue  # chmod would change what it points to
                _shareable(f)
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
def scratch_dir(near: Path | str, *, what: str) -> Iterator[Path]:
    """Yield an empty working directory beside `near` (not in it: `near` need not exist yet),
    removed when the block ends, however it ends. Files made there reach their place by
    os.replace (same filesystem); one a kill leaves behind is swept like staged_dir's. Running
    out of space in the block is a DiskFull naming `near`, what the work is for."""
    near = Path(near)
    with writing(near, what):
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

    Only safe while no writer is at work there (the run lock, gpt/rundir/runlock.py, sees to that).
    A staged_dir cut off between its two renames left `.<dest>.old` and no `<dest>`: the old
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
