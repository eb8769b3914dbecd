"""Where a corpus comes from: fetch or read its bytes, decode them, clean the text.

A source is spelled one of seven ways: `default` (or empty) for the embedded *Comedy of Errors*,
an `http://` / `https://` URL, a local file, a local directory whose corpus files (sorted by
name, not recursive) are read in order, an `s3://` or `gs://` object, an object-store prefix
(ending in "/") whose corpus files directly under it (in key order) are read as a directory's
are, or a Hugging Face dataset, `hf://datasets/ORG/NAME[@REVISION][/PATH]` (a file, a folder or
a glob of the repository). A corpus file is plain text, JSON Lines or Parquet, optionally
compressed (gpt/data/formats.py): a text file is one document; a file of records gives one
document per record's `--text_field` (gpt/data/records.py). Documents are streamed, never held
whole: a URL or an object is downloaded to a file first (gpt/fetch/objectstore.py), so both
cleaning passes read the same bytes; a file is read in chunks (twice: gpt/data/cleaning.py),
each document is cleaned on its own. Every refusal is an `InputError` naming the source and the
reason; the caller writes into a staging area, so a refusal leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from gpt.config.configs import DEFAULT_SOURCE, MAX_BYTES
from gpt.data import formats
from gpt.data.cleaning import SEPARATOR, emit, scan
from gpt.data.formats import Format, check_magic, format_of, format_or_text
from gpt.data.records import (
    Records,
    jsonl_texts,
    jsonl_values,
    parquet_lists,
    parquet_texts,
    write_documents,
)
from gpt.errors import InputError
from gpt.fetch.objectstore import Patience, Store, is_prefix, scheme_of
from gpt.progress import Progress
from gpt.rundir.atomic import writing

EMBEDDED_ASSET = "comedy_of_errors.txt"
USER_AGENT = "gpt-trainjobs/0.1 (load-corpus)"
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
    format: str = "txt"
    """'txt', 'jsonl' or 'parquet', '+gzip' (zstd, bz2, xz) where compressed."""
    documents: int = 1
    """A text file is one document; a file of records one per record kept."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Records skipped: 'null' and 'empty' (nothing but whitespace, before or after cleaning)."""

    def record(self) -> dict[str, Any]:
        """Its entry in corpus/source.json (raw: the file as stored, compressed or not). A plain
        text file's has the fields it always had, so its record is what it was."""
        out = {
            "origin": self.origin,
            "raw_bytes": self.raw_bytes,
            "raw_sha256": self.raw_sha256,
            "kept_bytes": self.kept_bytes,
            "removed": self.removed,
        }
        if self.format != "txt":
            out.update(format=self.format, documents=self.documents, skipped=self.skipped)
        return out


@dataclass(frozen=True)
class Download:
    """How patiently to fetch a URL."""

    timeout: float = 30.0
    retries: int = 3
    backoff: float = 1.0
    max_bytes: int = MAX_BYTES


def kind_of(source: str) -> str:
    """'embedded', 'url', 'file', 'dir', 'object' or 'prefix' (s3:// or gs://; decided from the
    spelling alone, no network), 'hf' (a Hugging Face dataset's file, folder or glob: the Hub
    says which); refuses other URL schemes."""
    if source in ("", DEFAULT_SOURCE):
        return "embedded"
    url = _URL.match(source)
    if url:
        scheme = url.group(1).lower()
        if scheme == "hf":
            check_hf(source)
            return "hf"
        if scheme_of(source):
            if not source.split("://", 1)[1].split("/", 1)[0]:
                raise InputError(f"--source {source!r}: no bucket")
            return "prefix" if is_prefix(source) else "object"
        if scheme not in ("http", "https"):
            raise InputError(
                f"--source {source!r}: scheme {scheme!r} is not supported "
                "(use an http(s) URL, an s3:// or gs:// URI, an hf://datasets/ORG/NAME URI, "
                "a local file or directory, or 'default')"
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


def check_hf(source: str) -> None:
    """Refuse an hf:// URI that names no dataset repository (no network)."""
    parts = source.split("://", 1)[1].split("/")
    if parts[0] != "datasets":
        raise InputError(f"--source {source!r}: only dataset repositories are read: "
                         "hf://datasets/ORG/NAME[@REVISION][/PATH]")
    if len(parts) < 3 or not parts[1] or not parts[2].split("@")[0]:
        raise InputError(f"--source {source!r}: no repository: "
                         "hf://datasets/ORG/NAME[@REVISION][/PATH]")


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
    return source if kind in ("url", "object", "prefix", "hf") else str(Path(source).resolve())


CORPUS_FILES = "*.txt, *.jsonl, *.json or *.parquet, each optionally .gz, .zst, .bz2 or .xz"


def read_source(
    source: str, dl: Download, scratch: Path, write: Callable[[bytes], object],
    progress: Callable[[int], None] = lambda n: None, text_field: str = "text",
    breaks: Callable[[int], None] = lambda at: None, chat: Chat | None = None,
) -> list[Document]:
    """Clean the documents of `source` in order, writing their kept text through `write` (as
    UTF-8 bytes), SEPARATOR (a blank line) between documents, each of whose byte offsets in the
    text `breaks` hears of (where the token files put end-of-text); returns what was read of
    each file. A URL or an object is downloaded into `scratch` first. `progress` hears of every
    chunk cleaned. Records give their text from the field `text_field`; with `chat`, their
    conversations (`messages`) go to it instead, and plain text is refused."""
    kind = kind_of(source)
    reader = Reader(dl.max_bytes, scratch, text_field, write, progress, breaks, chat)
    if kind in ("object", "prefix", "hf"):
        docs = read_objects(source, kind, dl, reader)
    elif kind == "embedded":
        with resources.as_file(resources.files("gpt.assets") / EMBEDDED_ASSET) as path:
            docs = [reader.read(f"embedded:{EMBEDDED_ASSET}", path, Format("txt"))]
    elif kind == "url":
        path = scratch / "download"
        fetch_url(source, dl, path)
        docs = [reader.read(source, path, format_or_text(source.split("?", 1)[0]))]
    elif kind == "file":
        docs = [reader.read(str(Path(source).resolve()), Path(source), format_or_text(source))]
    else:
        docs = read_dir(source, reader)
    return reader.finish(source, docs)


def corpus_files(folder: Path) -> list[Path]:
    """The corpus files directly in `folder` (by their names' extensions), in name order."""
    return sorted(p for p in folder.iterdir() if format_of(p.name) and not p.is_dir())


def read_dir(source: str, reader: Reader) -> list[Document]:
    files = corpus_files(Path(source))
    if not files:
        raise InputError(f"--source {source!r}: directory holds no corpus files ({CORPUS_FILES})")
    for p in files:
        kind_of(str(p))  # a FIFO or device named *.txt is refused, not read forever
    total = sum(p.stat().st_size for p in files)
    if total > reader.left:
        raise InputError(f"--source {source!r}: {total} bytes exceeds --max_bytes {reader.left}")
    return [reader.read(str(p.resolve()), p, format_of(p.name)) for p in files]  # type: ignore[arg-type]


# Where chat records go (gpt/data/conversations.py's `Conversations.take`): a file's name, its
# records' `messages` with where each is ("line 3", "row 3"), the text's writer, --max_bytes left.
Chat = Callable[[str, Iterator[tuple[str, object]], Callable[[bytes], object], int], Records]
MESSAGES = "messages"  # a chat record's field: OpenAI's fine-tuning files', Hugging Face's
CHAT_HINT = "--chat true reads each record's 'messages', an array of {role, content}"


class Reader:
    """Reads the files of one source in turn, each by its format, into one text: SEPARATOR
    between documents (each one's offset told to `breaks`), the --max_bytes cap over them all
    (growing files too). With `chat`, records are conversations, which it takes."""

    def __init__(self, max_bytes: int, scratch: Path, text_field: str,
                 write: Callable[[bytes], object], progress: Callable[[int], None],
                 breaks: Callable[[int], None] = lambda at: None,
                 chat: Chat | None = None) -> None:
        self.left, self.scratch, self.text_field = max_bytes, scratch, text_field
        self._write, self.progress, self.breaks, self.chat = write, progress, breaks, chat
        self.offset = 0  # bytes of text written
        self.written = False  # a document has been written: the next one starts after SEPARATOR

    def write(self, data: bytes) -> None:
        self._write(data)
        self.offset += len(data)

    def separator_at(self, ahead: int) -> None:
        """A SEPARATOR starts `ahead` bytes after the text written so far."""
        self.breaks(self.offset + ahead)

    def read(self, origin: str, path: Path, fmt: Format) -> Document:
        check_magic(origin, path, fmt)
        if fmt.kind == "txt" and self.chat:
            raise InputError(f"--source {origin!r}: plain text holds no conversations; "
                             f"{CHAT_HINT}, from JSON Lines or Parquet")
        if fmt.kind == "txt":
            if self.written:
                self.separator_at(0)
                self.write(SEPARATOR)
            doc = read_document(origin, path, self.left, self.write, self.progress,
                                fmt.compression)
        else:
            doc = self.read_records(origin, path, fmt)
        self.left -= doc.raw_bytes
        self.written = self.written or doc.documents > 0
        return doc

    def read_records(self, origin: str, path: Path, fmt: Format) -> Document:
        size, sha256 = stored(origin, path, self.left)
        if self.chat:
            return self.read_conversations(origin, path, fmt, size, sha256)
        if fmt.kind == "jsonl":
            raw = (formats.chunks(origin, path, fmt.compression, self.left) if fmt.compression
                   else read_chunks(path, self.left))
            texts = jsonl_texts(origin, raw, self.text_field)
        else:
            if fmt.compression:  # Parquet needs to seek (its footer first): decompress to a file
                path = self.decompressed(origin, path, fmt.compression)
            texts = parquet_texts(origin, path, self.text_field)
        with contextlib.closing(texts):  # its reading thread stops here, even on an error
            got = write_documents(origin, texts, self.write, self.written, self.left,
                                  self.progress, self.separator_at)
        (self.scratch / "decompressed").unlink(missing_ok=True)  # one on disk at a time
        return Document(origin, size, sha256, got.kept_bytes, got.removed, str(fmt),
                        got.documents, got.skipped)

    def read_conversations(self, origin: str, path: Path, fmt: Format, size: int,
                           sha256: str) -> Document:
        """A file of chat records, each record's `messages` handed to `chat`."""
        assert self.chat is not None
        values: Iterator[tuple[str, object]]
        if fmt.kind == "jsonl":
            raw = (formats.chunks(origin, path, fmt.compression, self.left) if fmt.compression
                   else read_chunks(path, self.left))
            inner = jsonl_values(origin, raw, MESSAGES, string=False, hint=CHAT_HINT)
            values = ((f"line {n}", v) for n, v in inner)
        else:
            if fmt.compression:
                path = self.decompressed(origin, path, fmt.compression)
            inner = parquet_lists(origin, path, MESSAGES, CHAT_HINT)
            values = ((f"row {n}", v) for n, v in enumerate(inner, 1))
        def write(data: bytes) -> None:
            self.write(data)
            self.progress(len(data))

        with contextlib.closing(inner):  # its reading thread stops here, even on an error
            got = self.chat(origin, values, write, self.left)
        (self.scratch / "decompressed").unlink(missing_ok=True)
        return Document(origin, size, sha256, got.kept_bytes, {}, str(fmt), got.documents,
                        got.skipped)

    def decompressed(self, origin: str, path: Path, compression: str) -> Path:
        out = self.scratch / "decompressed"
        with writing(out, f"{origin} decompressed"), open(out, "wb") as f:
            for chunk in formats.chunks(origin, path, compression, self.left):
                f.write(chunk)
        return out

    def finish(self, source: str, docs: list[Document]) -> list[Document]:
        """Refuse a source that gave no document (every record null or empty)."""
        if not any(d.documents for d in docs):
            skipped = {}
            for d in docs:
                for k, v in d.skipped.items():
                    skipped[k] = skipped.get(k, 0) + v
            what = ", ".join(f"{v:,} {k}" for k, v in skipped.items()) or "no records"
            raise InputError(f"--source {source!r}: empty dataset: no document with text "
                             f"({what})")
        return docs


def stored(origin: str, path: Path, max_bytes: int) -> tuple[int, str]:
    """A file's size and sha256 as stored (compressed or not), read once; over `max_bytes`
    refused."""
    digest, size = hashlib.sha256(), 0
    for chunk in read_chunks(path, max_bytes):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def read_objects(source: str, kind: str, dl: Download, reader: Reader) -> list[Document]:
    """An object, a prefix's corpus objects in key order, or a Hugging Face dataset's files,
    each downloaded into the scratch directory, read by its format, and deleted before the next
    (disk: the largest file, not the prefix)."""
    store = Store(source, "--source", Patience(dl.timeout, dl.retries))
    if kind == "object":
        objects = [(source, store.size())]
    else:
        objects = store.data_files(format_of, CORPUS_FILES)
    total = sum(size for _, size in objects)
    if total > dl.max_bytes:
        raise InputError(f"--source {source!r}: {total} bytes exceeds --max_bytes {dl.max_bytes}")
    docs: list[Document] = []
    path = reader.scratch / "download"
    for uri, _ in objects:
        store.download(uri, path, reader.left)
        docs.append(reader.read(uri, path, format_or_text(uri)))
        path.unlink()
    return docs


def read_document(
    origin: str, path: Path, max_bytes: int, write: Callable[[bytes], object],
    progress: Callable[[int], None] = lambda n: None, compression: str | None = None,
) -> Document:
    """Check and clean the text file at `path` (at most `max_bytes`, decompressed where it is
    compressed), writing the kept text."""
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"--source {str(path)!r}: {size} bytes exceeds --max_bytes {max_bytes}")

    def text(limit: int, cut: bool = False) -> Iterator[bytes]:
        if compression:
            return _cut(formats.chunks(origin, path, compression, max_bytes), limit)
        return read_chunks(path, limit, cut)

    scanned = scan(origin, text(max_bytes))

    def again() -> Iterator[bytes]:  # the bytes scanned, even should the file have grown since
        for chunk in text(scanned.raw_bytes, cut=True):
            progress(len(chunk))
            yield chunk

    kept = emit(origin, scanned, again(), write)  # bytes
    if not compression:
        return Document(origin, scanned.raw_bytes, scanned.raw_sha256, kept, scanned.removed)
    raw_bytes, raw_sha256 = stored(origin, path, max_bytes)
    return Document(origin, raw_bytes, raw_sha256, kept, scanned.removed, f"txt+{compression}")


def _cut(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    for chunk in chunks:
        if len(chunk) >= limit:
            yield chunk[:limit]
            return
        limit -= len(chunk)
        yield chunk


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
