"""Where a corpus comes from: fetch or read its bytes, decode them, clean the text.

A source is spelled one of six ways: `default` (or empty) for the embedded *Comedy of Errors*,
an `http://` / `https://` URL, a local file, a local directory whose `*.txt` files (sorted by
name, not recursive) are read in order, an `s3://` or `gs://` object, or an object-store prefix
(ending in "/") whose `*.txt` objects (in key order, not recursive) are read as a directory's
files are. Documents are streamed, never held whole: a URL or an object is downloaded to a file
first (gpt/data/objectstore.py), so both cleaning passes read the same bytes; a file is read in
chunks (twice: gpt/data/cleaning.py), each file or object of a directory or prefix is cleaned on its
own. Every refusal is an `InputError` naming the source and the reason; the caller writes into a
staging area, so a refusal leaves nothing behind.
"""

from __future__ import annotations

import http.client
import os
import re
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpt.data.cleaning import emit, scan
from gpt.data.objectstore import Patience, Store, is_prefix, scheme_of
from gpt.data.progress import Progress
from gpt.errors import InputError
from gpt.rundir.atomic import writing

DEFAULT_SOURCE = "default"
EMBEDDED_ASSET = "comedy_of_errors.txt"
USER_AGENT = "gpt-trainjobs/0.1 (load-corpus)"
MAX_BYTES = 10_000_000_000  # --max_bytes's default (gpt/config/configs.py says why)
CHUNK = 1 << 20  # bytes read (or downloaded) at a time: memory per document stays this

# Anything spelled like `scheme://...` is a URL (and only http/https are fetched).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass
class Document:
    """One text as read: where from, its raw size and hash, what cleaning kept and removed."""

    origin: str
    raw_bytes: int
    raw_sha256: str
    kept_bytes: int
    removed: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "raw_bytes": self.raw_bytes,
            "raw_sha256": self.raw_sha256,
            "kept_bytes": self.kept_bytes,
            "removed": self.removed,
        }


@dataclass(frozen=True)
class Download:
    """How patiently to fetch a URL."""

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 1.0
    max_bytes: int = MAX_BYTES


def kind_of(source: str) -> str:
    """'embedded', 'url', 'file', 'dir', 'object' or 'prefix' (s3:// or gs://; decided from the
    spelling alone, no network); refuses other URL schemes."""
    if source in ("", DEFAULT_SOURCE):
        return "embedded"
    url = _URL.match(source)
    if url:
        scheme = url.group(1).lower()
        if scheme_of(source):
            if not source.split("://", 1)[1].split("/", 1)[0]:
                raise InputError(f"--source {source!r}: no bucket")
            return "prefix" if is_prefix(source) else "object"
        if scheme not in ("http", "https"):
            raise InputError(
                f"--source {source!r}: scheme {scheme!r} is not supported "
                "(use an http(s) URL, an s3:// or gs:// URI, a local file or directory, "
                "or 'default')"
            )
        return "url"
    try:
        mode = Path(source).stat().st_mode  # follows symlinks: what a read would open
    except FileNotFoundError:
        raise InputError(f"--source {source!r}: no such file or directory") from None
    except OSError as e:
        raise InputError(f"--source {source!r}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    raise InputError(f"--source {source!r}: {_file_type(mode)}, not a regular file or directory")


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def canonical(source: str) -> str:
    """One spelling per source, for provenance and for telling whether a rerun has new inputs."""
    kind = kind_of(source)
    if kind == "embedded":
        return DEFAULT_SOURCE
    return source if kind in ("url", "object", "prefix") else str(Path(source).resolve())


def read_source(
    source: str, dl: Download, scratch: Path, write: Callable[[bytes], object],
    progress: Callable[[int], None] = lambda n: None,
) -> list[Document]:
    """Clean the documents of `source` in order, writing their kept text through `write` (as
    UTF-8 bytes), one blank line ("\\n\\n") between documents; returns
    what was read of each. A URL or an object is downloaded into `scratch` first. `progress`
    hears of every chunk of raw bytes cleaned."""
    kind = kind_of(source)
    if kind in ("object", "prefix"):
        return read_objects(source, kind, dl, scratch, write, progress)
    if kind == "embedded":
        with resources.as_file(resources.files("gpt.assets") / EMBEDDED_ASSET) as path:
            origin = f"embedded:{EMBEDDED_ASSET}"
            return [read_document(origin, path, dl.max_bytes, write, progress)]
    if kind == "url":
        path = scratch / "download"
        fetch_url(source, dl, path)
        return [read_document(source, path, dl.max_bytes, write, progress)]
    if kind == "file":
        origin = str(Path(source).resolve())
        return [read_document(origin, Path(source), dl.max_bytes, write, progress)]
    files = sorted(p for p in Path(source).glob("*.txt") if not p.is_dir())
    if not files:
        raise InputError(f"--source {source!r}: directory holds no *.txt files")
    for p in files:
        kind_of(str(p))  # a FIFO or device named *.txt is refused, not read forever
    total = sum(p.stat().st_size for p in files)
    if total > dl.max_bytes:
        raise InputError(f"--source {source!r}: {total} bytes exceeds --max_bytes {dl.max_bytes}")
    docs: list[Document] = []
    left = dl.max_bytes  # the cap holds for the whole directory, growing files too
    for p in files:
        if docs:
            write(b"\n\n")
        docs.append(read_document(str(p.resolve()), p, left, write, progress))
        left -= docs[-1].raw_bytes
    return docs


def read_objects(
    source: str, kind: str, dl: Download, scratch: Path, write: Callable[[bytes], object],
    progress: Callable[[int], None],
) -> list[Document]:
    """An object, or a prefix's `*.txt` objects in key order, each downloaded into `scratch`,
    cleaned, and deleted before the next (disk: the largest object, not the prefix)."""
    store = Store(source, "--source", Patience(dl.timeout, dl.retries))
    objects = [(source, store.size())] if kind == "object" else store.texts()
    total = sum(size for _, size in objects)
    if total > dl.max_bytes:
        raise InputError(f"--source {source!r}: {total} bytes exceeds --max_bytes {dl.max_bytes}")
    docs: list[Document] = []
    path = scratch / "download"
    for uri, _ in objects:
        if docs:
            write(b"\n\n")
        got = store.download(uri, path, dl.max_bytes - sum(d.raw_bytes for d in docs))
        docs.append(read_document(uri, path, got, write, progress))
        path.unlink()
    return docs


def read_document(
    origin: str, path: Path, max_bytes: int, write: Callable[[bytes], object],
    progress: Callable[[int], None] = lambda n: None,
) -> Document:
    """Check and clean the file at `path` (at most `max_bytes`), writing the kept text."""
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"--source {str(path)!r}: {size} bytes exceeds --max_bytes {max_bytes}")
    scanned = scan(origin, read_chunks(path, max_bytes))

    def again() -> Iterator[bytes]:  # the bytes scanned, even should the file have grown since
        for chunk in read_chunks(path, scanned.raw_bytes, cut=True):
            progress(len(chunk))
            yield chunk

    kept = emit(origin, scanned, again(), write)  # bytes
    return Document(origin, scanned.raw_bytes, scanned.raw_sha256, kept, scanned.removed)


def read_chunks(path: Path, max_bytes: int, cut: bool = False) -> Iterator[bytes]:
    """A regular file's bytes in chunks; more than `max_bytes` (should it grow while read) is
    refused, or with `cut` not read."""
    try:
        # O_NONBLOCK: should the path have become a FIFO since it was checked, open() returns
        # at once instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise InputError(f"--source {str(path)!r}: cannot read: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputError(f"--source {str(path)!r}: not a regular file")
        left = max_bytes
        while True:
            try:
                chunk = f.read(min(CHUNK, left + 1))
            except OSError as e:
                reason = e.strerror or e
                raise InputError(f"--source {str(path)!r}: cannot read: {reason}") from None
            if not chunk:
                return
            if len(chunk) > left:
                if cut:
                    yield chunk[:left]
                    return
                raise InputError(f"--source {str(path)!r}: more than --max_bytes {max_bytes} bytes")
            left -= len(chunk)
            yield chunk


def fetch_url(url: str, dl: Download, dest: Path) -> int:
    """GET `url` into the file `dest` with a timeout and a size cap, retrying transient failures
    with backoff; returns the bytes written."""
    last = ""
    for attempt in range(dl.retries + 1):
        if attempt:
            time.sleep(dl.backoff * 2 ** (attempt - 1))
        try:
            return _get(url, dl, dest)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code} {e.reason}"
            if e.code < 500 and e.code != 429:  # the server's answer will not change on retry
                break
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets are OSErrors
            reason = getattr(e, "reason", e)
            last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
        print(f"corpus: fetch {url} attempt {attempt + 1}/{dl.retries + 1} failed: {last}")
    raise InputError(f"--source {url!r}: unreachable after {attempt + 1} attempt(s): {last}")


def _get(url: str, dl: Download, dest: Path) -> int:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    # A full volume is a DiskFull, not an OSError that the retries above take for the network's.
    with (
        writing(dest, f"the download of {url}"),
        urllib.request.urlopen(req, timeout=dl.timeout) as resp,
        open(dest, "wb") as out,
    ):
        length = resp.headers.get("Content-Length")
        length = length or ""
        if length.isdigit() and int(length) > dl.max_bytes:
            raise InputError(f"--source {url!r}: {length} bytes exceeds --max_bytes {dl.max_bytes}")
        got, progress = 0, Progress("downloaded", int(length) if length.isdigit() else 0)
        while chunk := resp.read(CHUNK):
            got += len(chunk)
            if got > dl.max_bytes:
                raise InputError(f"--source {url!r}: more than --max_bytes {dl.max_bytes} bytes")
            out.write(chunk)
            progress.update(len(chunk))
        progress.done()
    return got
