"""Where a corpus comes from: fetch or read its bytes, decode them, clean the text.

A source is spelled one of four ways: `default` (or empty) for the embedded *Comedy of Errors*,
an `http://` / `https://` URL, a local file, or a local directory whose `*.txt` files (sorted by
name, not recursive) are read in order. Every refusal is an `InputError` naming the source and
the reason, raised before anything is written.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import stat
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpt.errors import InputError

DEFAULT_SOURCE = "default"
EMBEDDED_ASSET = "comedy_of_errors.txt"
USER_AGENT = "gpt-trainjobs/0.1 (load-corpus)"
CHUNK = 1 << 16

# Project Gutenberg wraps every ebook in "*** START OF THE PROJECT GUTENBERG EBOOK ... ***" and
# "*** END OF THE PROJECT GUTENBERG EBOOK ... ***"; everything outside them is header and licence.
_START = re.compile(r"^\*{3}\s*START OF (?:THE |THIS )?PROJECT GUTENBERG.*$", re.I | re.M)
_END = re.compile(r"^\*{3}\s*END OF (?:THE |THIS )?PROJECT GUTENBERG.*$", re.I | re.M)
# Anything spelled like `scheme://...` is a URL (and only http/https are fetched).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass
class Document:
    """One text as read: where from, its raw size and hash, and the cleaned text."""

    origin: str
    raw_bytes: int
    raw_sha256: str
    text: str
    removed: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "raw_bytes": self.raw_bytes,
            "raw_sha256": self.raw_sha256,
            "kept_bytes": len(self.text.encode("utf-8")),
            "removed": self.removed,
        }


@dataclass(frozen=True)
class Download:
    """How patiently to fetch a URL."""

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 1.0
    max_bytes: int = 100_000_000


def kind_of(source: str) -> str:
    """'embedded', 'url', 'file' or 'dir'; refuses URL schemes other than http(s)."""
    if source in ("", DEFAULT_SOURCE):
        return "embedded"
    url = _URL.match(source)
    if url:
        scheme = url.group(1).lower()
        if scheme not in ("http", "https"):
            raise InputError(
                f"--source {source!r}: scheme {scheme!r} is not supported "
                "(use an http(s) URL, a local file or directory, or 'default')"
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
    return source if kind == "url" else str(Path(source).resolve())


def read_source(source: str, dl: Download) -> list[Document]:
    """The cleaned documents of `source`, in order (one, except for a directory)."""
    kind = kind_of(source)
    if kind == "embedded":
        raw = (resources.files("gpt.assets") / EMBEDDED_ASSET).read_bytes()
        return [to_document(f"embedded:{EMBEDDED_ASSET}", raw)]
    if kind == "url":
        return [to_document(source, fetch_url(source, dl))]
    if kind == "file":
        return [to_document(str(Path(source).resolve()), read_file(Path(source), dl.max_bytes))]
    files = sorted(p for p in Path(source).glob("*.txt") if not p.is_dir())
    if not files:
        raise InputError(f"--source {source!r}: directory holds no *.txt files")
    for p in files:
        kind_of(str(p))  # a FIFO or device named *.txt is refused, not read forever
    total = sum(p.stat().st_size for p in files)
    if total > dl.max_bytes:
        raise InputError(f"--source {source!r}: {total} bytes exceeds --max_bytes {dl.max_bytes}")
    docs, left = [], dl.max_bytes  # the cap holds for the whole directory, growing files too
    for p in files:
        raw = read_file(p, left)
        left -= len(raw)
        docs.append(to_document(str(p.resolve()), raw))
    return docs


def read_file(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them even if it grows while read."""
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"--source {str(path)!r}: {size} bytes exceeds --max_bytes {max_bytes}")
    try:
        # O_NONBLOCK: should the path have become a FIFO since it was checked, open() returns
        # at once instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputError(f"--source {str(path)!r}: not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"--source {str(path)!r}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputError(f"--source {str(path)!r}: more than --max_bytes {max_bytes} bytes")
    return data


def fetch_url(url: str, dl: Download) -> bytes:
    """GET `url` with a timeout and a size cap, retrying transient failures with backoff."""
    last = ""
    for attempt in range(dl.retries + 1):
        if attempt:
            time.sleep(dl.backoff * 2 ** (attempt - 1))
        try:
            return _get(url, dl)
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code} {e.reason}"
            if e.code < 500 and e.code != 429:  # the server's answer will not change on retry
                break
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets are OSErrors
            reason = getattr(e, "reason", e)
            last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
        print(f"corpus: fetch {url} attempt {attempt + 1}/{dl.retries + 1} failed: {last}")
    raise InputError(f"--source {url!r}: unreachable after {attempt + 1} attempt(s): {last}")


def _get(url: str, dl: Download) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(req, timeout=dl.timeout) as resp:
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > dl.max_bytes:
            raise InputError(f"--source {url!r}: {length} bytes exceeds --max_bytes {dl.max_bytes}")
        body = bytearray()
        while chunk := resp.read(CHUNK):
            body += chunk
            if len(body) > dl.max_bytes:
                raise InputError(f"--source {url!r}: more than --max_bytes {dl.max_bytes} bytes")
    return bytes(body)


def to_document(origin: str, raw: bytes) -> Document:
    """Decode and clean `raw`; refuse what is not UTF-8 text."""
    if not raw:
        raise InputError(f"--source {origin!r}: empty")
    if b"\x00" in raw:
        raise InputError(f"--source {origin!r}: binary file (contains NUL bytes), not text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"--source {origin!r}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    text, removed = clean(text)
    if not text.strip():
        raise InputError(f"--source {origin!r}: no text left after cleaning")
    return Document(origin, len(raw), hashlib.sha256(raw).hexdigest(), text, removed)


def clean(text: str) -> tuple[str, dict[str, int]]:
    """Drop a BOM, normalise newlines to \\n, cut Project Gutenberg's header and footer.

    Returns the text and what was removed (counts of characters, or of line breaks rewritten).
    """
    removed: dict[str, int] = {}
    if text.startswith("\ufeff"):
        text = text[1:]
        removed["bom"] = 1
    crlf = text.count("\r\n")
    text = text.replace("\r\n", "\n")
    cr = text.count("\r")
    text = text.replace("\r", "\n")
    if crlf or cr:
        removed["newlines_normalised"] = crlf + cr
    start, end = _START.search(text), _END.search(text)
    if start or end:
        lo = start.end() if start else 0
        hi = end.start() if end and end.start() >= lo else len(text)
        removed["gutenberg_header_chars"] = lo
        removed["gutenberg_footer_chars"] = len(text) - hi
        body = text[lo:hi]
        # The blank lines around the markers belong to the wrapper, not the book.
        text = body.strip()
        removed["edge_whitespace_chars"] = len(body) - len(text)
    return text, removed
