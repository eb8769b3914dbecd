"""Decode and clean one document streamed in byte chunks, in memory bounded by the chunk size.

Cleaning drops a BOM, normalises newlines to \\n, and cuts Project Gutenberg's header and footer
(everything outside "*** START OF ... PROJECT GUTENBERG ..." and "*** END OF ..."). Where the
markers are depends on the whole document, so a document is read twice: `scan` checks its bytes
and finds the markers, `emit` writes what is kept. Both see the same normalised text, chunk by
chunk; nothing holds more than a chunk (and the line it ends in). A document the scan found
nothing to change in (most plain texts) is written as the bytes it is, without decoding it again.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gpt.errors import InputError

# Project Gutenberg wraps every ebook in "*** START OF THE PROJECT GUTENBERG EBOOK ... ***" and
# "*** END OF THE PROJECT GUTENBERG EBOOK ... ***"; everything outside them is header and licence.
_START = re.compile(r"^\*{3}\s*START OF (?:THE |THIS )?PROJECT GUTENBERG.*$", re.I | re.M)
_END = re.compile(r"^\*{3}\s*END OF (?:THE |THIS )?PROJECT GUTENBERG.*$", re.I | re.M)
# A line longer than this is searched for markers in pieces (only its start can begin one).
LONG_LINE = 1 << 22
# What the cleaned text holds between two documents: a blank line, where the token files hold
# end-of-text instead (gpt/data/tokenfiles.py; a tokenizer without one keeps the blank line).
SEPARATOR = b"\n\n"


@dataclass
class Scan:
    """What the first pass learnt: the raw bytes' size and hash, the normalised text's length,
    where the markers cut it (`lo`, `hi`: the kept span; `marked`: whether any marker was found),
    what normalising rewrote, and whether the text is only whitespace."""

    raw_bytes: int = 0
    raw_sha256: str = ""
    chars: int = 0
    lo: int = 0
    hi: int = 0
    marked: bool = False
    removed: dict[str, int] = field(default_factory=dict)
    blank: bool = True

    @property
    def unchanged(self) -> bool:
        """Cleaning keeps the document's bytes as they are: no marker, BOM or \\r in it."""
        return not self.marked and not self.removed


class NotUTF8(Exception):
    """The byte `byte` at `offset` of a stream does not decode as UTF-8."""

    def __init__(self, offset: int, byte: int) -> None:
        super().__init__(f"byte 0x{byte:02x} at offset {offset}")
        self.offset, self.byte = offset, byte


def normalised(chunks: Iterable[bytes], removed: dict[str, int]) -> Iterator[str]:
    """The UTF-8 text of `chunks` without a leading BOM, with \\r\\n and lone \\r made \\n;
    counts what it rewrote into `removed`. Raises NotUTF8 at the first undecodable byte."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed, held, first, newlines = 0, "", True, 0
    for chunk, final in _ending(chunks):
        pending = decoder.getstate()[0]
        try:
            text = held + decoder.decode(chunk, final=final)
        except UnicodeDecodeError as e:
            raise NotUTF8(fed - len(pending) + e.start, (pending + chunk)[e.start]) from None
        fed += len(chunk)
        if first and text:
            first = False
            if text.startswith("\ufeff"):
                text = text[1:]
                removed["bom"] = 1
        # A \r at a chunk's end may be the first half of \r\n: wait for the next chunk.
        held = text[-1:] if text.endswith("\r") and not final else ""
        text = text[: len(text) - len(held)]
        if "\r" in text:
            crlf = text.count("\r\n")
            text = text.replace("\r\n", "\n")
            newlines += crlf + text.count("\r")
            text = text.replace("\r", "\n")
        if text:
            yield text
    if newlines:
        removed["newlines_normalised"] = newlines


def _ending(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool]]:
    for chunk in chunks:
        if chunk:
            yield chunk, False
    yield b"", True


def scan(origin: str, chunks: Iterable[bytes], nul_ok: bool = False) -> Scan:
    """Check `chunks` are non-empty UTF-8 text without NUL bytes (refusals in the order the
    in-memory reader had: empty, binary, not UTF-8) and find the Gutenberg markers. `nul_ok`:
    a NUL is text (a record's field, where JSON spelt it `\\u0000` on purpose)."""
    s = Scan()
    digest = hashlib.sha256()
    nul = False

    def raw() -> Iterator[bytes]:
        nonlocal nul
        for chunk in chunks:
            s.raw_bytes += len(chunk)
            digest.update(chunk)
            nul = nul or b"\x00" in chunk
            yield chunk

    markers = _Markers()
    bad: NotUTF8 | None = None
    stream = raw()
    try:
        for text in normalised(stream, s.removed):
            markers.feed(text)
            s.blank = s.blank and text.isspace()
    except NotUTF8 as e:
        bad = e
        for _ in stream:  # still hash and look for NUL bytes: "binary" comes first
            pass
    s.raw_sha256 = digest.hexdigest()
    if not s.raw_bytes:
        raise InputError(f"--source {origin!r}: empty")
    if nul and not nul_ok:
        raise InputError(f"--source {origin!r}: binary file (contains NUL bytes), not text")
    if bad is not None:
        raise InputError(f"--source {origin!r}: not UTF-8 text ({bad})")
    start, end = markers.finish()
    s.chars = markers.pos
    if start is not None or end is not None:
        s.marked = True
        s.lo = start if start is not None else 0
        s.hi = end if end is not None and end >= s.lo else s.chars
    else:
        s.hi = s.chars
    return s


class _Markers:
    """The first START marker's end and the first END marker's start, found line-safely in a
    stream of text: each search runs on whole lines, so ^ and $ match where they would in the
    whole text (a marker's `***` and the words after it may even be lines apart)."""

    def __init__(self) -> None:
        self.pos = 0  # characters fed so far
        self.carry = ""  # the text after the last searched line
        self.base = 0  # offset of `carry` in the text
        self.midline = False  # `carry` starts inside a line (a long one, cut)
        self.start: int | None = None
        self.start_open = False  # the START line ran past the searched text: its end is later
        self.end: int | None = None

    def feed(self, text: str, final: bool = False) -> None:
        self.pos += len(text)
        if self.end is not None and self.start is not None and not self.start_open:
            return
        buf = self.carry + text if self.carry else text
        if final:
            cut = len(buf)
        else:
            nl = buf.rfind("\n")
            if nl < 0 and len(buf) < LONG_LINE:
                self.carry = buf
                return
            cut = nl + 1 if nl >= 0 else len(buf)
            # "***" then only whitespace: a marker may go on in the next chunk. (The trailing
            # whitespace is looked for near the cut: a chunk is not copied to strip it.)
            lo = max(cut - 64, 0)
            end = lo + len(buf[lo:cut].rstrip())
            if end == lo and lo:
                end = len(buf[:cut].rstrip())
            if buf.endswith("***", 0, end) and (end == 3 or buf[end - 4] == "\n"):
                cut = end - 3
        complete = final or (cut > 0 and buf[cut - 1] == "\n")
        self._search(buf, cut, complete)
        if cut:
            self.midline = not complete
        self.carry, self.base = buf[cut:], self.base + cut

    def _search(self, buf: str, cut: int, complete: bool) -> None:
        """Look for the markers in buf[:cut] (searched in place: a chunk is not copied)."""
        pos = 0
        if self.midline:  # the rest of a long line: no marker starts in it
            nl = buf.find("\n", 0, cut)
            if self.start_open and (nl >= 0 or complete):
                self.start = self.base + (nl if nl >= 0 else cut)
                self.start_open = False
            pos = nl + 1 if nl >= 0 else cut
        # Every marker has "***": search from the first one's line. A single "*" is looked for
        # first, which is several times faster where a text has none.
        star = buf.find("*", pos, cut)
        stars = buf.find("***", star, cut) if star >= 0 else -1
        if stars < 0:
            return
        pos = max(pos, buf.rfind("\n", pos, stars) + 1)
        if self.start is None:
            m = _START.search(buf, pos, cut)
            if m:
                self.start = self.base + m.end()
                # $ matched where a long line was cut, not at its end: that end comes later
                self.start_open = m.end() == cut and not complete
        if self.end is None:
            m = _END.search(buf, pos, cut)
            if m:
                self.end = self.base + m.start()

    def finish(self) -> tuple[int | None, int | None]:
        self.feed("", final=True)
        return self.start, self.end


def emit(
    origin: str, scanned: Scan, chunks: Iterable[bytes], write: Callable[[bytes], object]
) -> int:
    """Write the kept part of the document whose bytes `chunks` are again (the span between the
    markers, stripped of the blank lines around it, normalised) as UTF-8 with `write`, and record
    what the markers removed; returns the bytes kept. Refuses a document with no text left."""
    if scanned.unchanged:  # the kept text is the bytes as read: copy them, no decoding
        if scanned.blank:
            raise InputError(f"--source {origin!r}: no text left after cleaning")
        nbytes = 0
        for chunk in chunks:
            write(chunk)
            nbytes += len(chunk)
        return nbytes
    pos, kept, nbytes, started, held, any_text = 0, 0, 0, not scanned.marked, "", False
    for piece in normalised(chunks, {}):
        lo, hi = max(scanned.lo - pos, 0), min(scanned.hi - pos, len(piece))
        pos += len(piece)
        if lo >= hi:
            continue
        piece = piece[lo:hi]
        if scanned.marked:
            if not started:
                piece = piece.lstrip()
                started = bool(piece)
            piece = held + piece
            body = piece.rstrip()
            held = piece[len(body):]
            piece = body
        if piece:
            any_text = any_text or not piece.isspace()
            kept += len(piece)
            data = piece.encode("utf-8")
            write(data)
            nbytes += len(data)
    if not any_text:
        raise InputError(f"--source {origin!r}: no text left after cleaning")
    if scanned.marked:
        removed = scanned.removed
        removed["gutenberg_header_chars"] = scanned.lo
        removed["gutenberg_footer_chars"] = scanned.chars - scanned.hi
        removed["edge_whitespace_chars"] = scanned.hi - scanned.lo - kept
    return nbytes


def clean(text: str, nul_ok: bool = False) -> tuple[str, dict[str, int]]:
    """`text` cleaned as a document of that text would be (without the checks on its bytes):
    the cleaned text and what was removed (counts of characters, or of line breaks rewritten).
    Refuses, as a document, text left empty by cleaning (and, unless `nul_ok`, NUL bytes)."""
    raw = [text.encode("utf-8")]
    scanned = scan("text", raw, nul_ok)
    out: list[bytes] = []
    emit("text", scanned, raw, out.append)
    return b"".join(out).decode("utf-8"), scanned.removed
