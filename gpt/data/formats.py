"""What a corpus file is, from its name, checked against its first bytes; its bytes decompressed.

A corpus file is plain text (`.txt`), JSON Lines (`.jsonl`, or `.json` holding one object a
line) or Parquet (`.parquet`), each optionally compressed: `.gz` (gzip), `.zst` (zstd), `.bz2`,
`.xz`. The name says which; the first bytes must agree (a `.jsonl.gz` that is not gzip, a
`.txt` that is, a `.parquet` without Parquet's `PAR1`: one line each). Decompression streams in
CHUNK-sized pieces, never the whole file, and refuses a truncated or corrupt stream.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpt.errors import InputError, first_line

CHUNK = 1 << 20  # decompressed bytes handed on at a time
# Compressed bytes fed to zstd at a time: zstandard's decompressobj has no output limit, so the
# input piece bounds what one call can produce (a frame of zeros expands ~32,000-fold: 128 MB).
ZSTD_FEED = 4 << 10

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
MAGIC = {
    "gzip": b"\x1f\x8b",
    "zstd": b"\x28\xb5\x2f\xfd",
    "bz2": b"BZh",
    "xz": b"\xfd7zXZ\x00",
    "parquet": b"PAR1",
}


@dataclass(frozen=True)
class Format:
    """A corpus file's format ('txt', 'jsonl', 'parquet') and compression (None: none)."""

    kind: str
    compression: str | None = None

    def __str__(self) -> str:
        return self.kind + (f"+{self.compression}" if self.compression else "")


def format_of(name: str) -> Format | None:
    """The format a file's name says (`.jsonl.zst`, `.parquet`, `.txt.gz`), or None for a name
    that is not a corpus file's (a directory's README.md, .gitattributes)."""
    lower = name.lower().rsplit("/", 1)[-1]
    compression = None
    for ext, comp in COMPRESSIONS.items():
        if lower.endswith(ext):
            compression, lower = comp, lower[: -len(ext)]
            break
    for ext, kind in FORMATS.items():
        if lower.endswith(ext):
            return Format(kind, compression)
    return None


def format_or_text(name: str) -> Format:
    """A single file or URL: its format, or plain text where the name says none (`pg1504`,
    `book.md`), as a single source always was; the bytes are still checked."""
    fmt = format_of(name)
    if fmt is None:
        lower = name.lower()
        comp = next((c for ext, c in COMPRESSIONS.items() if lower.endswith(ext)), None)
        return Format("txt", comp)
    return fmt


def looks_like(head: bytes) -> str | None:
    """The compression or binary format `head` (a file's first bytes) starts with, or None."""
    return next((name for name, magic in MAGIC.items() if head.startswith(magic)), None)


def check_magic(origin: str, path: Path, fmt: Format) -> None:
    """Refuse a file whose first bytes say another format than its name (`fmt`) does."""
    with open(path, "rb") as f:
        head = f.read(8)
    seen = looks_like(head)
    if fmt.compression:
        if seen != fmt.compression:
            what = f"{seen} data" if seen else "not compressed"
            raise InputError(
                f"--source {origin!r}: named {fmt.compression} but its bytes are {what}"
            )
        return
    if fmt.kind == "parquet":
        if seen != "parquet":
            what = f"{seen} data" if seen else "no Parquet file (no PAR1 magic)"
            raise InputError(f"--source {origin!r}: named .parquet but its bytes are {what}")
    elif seen is not None:
        raise InputError(
            f"--source {origin!r}: named as {fmt.kind} but its bytes are {seen} data "
            f"(name it for what it is, e.g. .{fmt.kind}{_suffix(seen)})"
        )


def _suffix(seen: str) -> str:
    return {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2", "xz": ".xz"}.get(seen, "")


def chunks(origin: str, path: Path, compression: str | None, max_bytes: int) -> Iterator[bytes]:
    """The file's bytes, decompressed, CHUNK at a time; more than `max_bytes` decompressed (a
    compression bomb, or a corpus over the cap) is refused, as is a truncated or corrupt
    stream."""
    if compression is None:
        raise ValueError("chunks() decompresses: read an uncompressed file directly")
    got = 0
    try:
        for chunk in _DECOMPRESS[compression](path):
            got += len(chunk)
            if got > max_bytes:
                raise InputError(
                    f"--source {origin!r}: decompresses to more than --max_bytes {max_bytes} bytes"
                )
            yield chunk
    except (EOFError, OSError, zlib.error, lzma.LZMAError, _ZstdError) as e:
        if isinstance(e, InputError):
            raise
        said = first_line(e)
        raise InputError(
            f"--source {origin!r}: truncated or corrupt {compression} data ({said})"
        ) from None


def _stdlib(opener: Callable[[Path], BinaryIO]) -> Callable[[Path], Iterator[bytes]]:
    """gzip, bz2, xz: the standard library's readers stream with bounded output, handle
    concatenated streams, and raise EOFError on a truncated one."""

    def read(path: Path) -> Iterator[bytes]:
        with opener(path) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    return read


class _ZstdError(Exception):
    """zstandard.ZstdError, or a stream that ends inside a frame (never raised otherwise)."""


def _zstd(path: Path) -> Iterator[bytes]:
    """zstd frames (one or several, concatenated) decompressed; a stream that ends inside a
    frame is refused (zstandard's stream_reader returns what it has and says nothing)."""
    import zstandard

    out, pending = bytearray(), 0
    dobj = zstandard.ZstdDecompressor().decompressobj()
    started = False
    with open(path, "rb") as f:
        while raw := f.read(CHUNK):
            for at in range(0, len(raw), ZSTD_FEED):
                piece = raw[at : at + ZSTD_FEED]
                while piece:
                    if dobj.eof:  # the next frame begins in this piece
                        dobj = zstandard.ZstdDecompressor().decompressobj()
                    try:
                        out += dobj.decompress(piece)
                    except zstandard.ZstdError as e:
                        raise _ZstdError(str(e)) from None
                    started = True
                    piece = dobj.unused_data if dobj.eof else b""
                if len(out) >= CHUNK:
                    yield bytes(out)
                    out.clear()
            pending += len(raw)
    if started and not dobj.eof:
        raise _ZstdError(f"the stream ends inside a frame, after {pending} bytes")
    if out:
        yield bytes(out)


_DECOMPRESS: dict[str, Callable[[Path], Iterator[bytes]]] = {
    "gzip": _stdlib(lambda p: gzip.open(p, "rb")),
    "bz2": _stdlib(lambda p: bz2.open(p, "rb")),
    "xz": _stdlib(lambda p: lzma.open(p, "rb")),
    "zstd": _zstd,
}
