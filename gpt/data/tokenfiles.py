"""Tokenize a text file into the token files the trainer memory-maps, in bounded memory.

The text is read in chunks of about a megabyte and never held whole; ids go straight to files.
Train is the text's first `cut` characters, validation the rest, each tokenized as if alone.
Where the text holds several documents (a blank line, SEPARATOR, between each two, at byte
offsets the caller noted), GPT-2's ids hold end-of-text in place of each separator, and each
document is encoded on its own (`chunks`, `_encoded`), as nanoGPT's openwebtext/prepare.py does.

- gpt2: the chunks are encoded a thread per usable core (tiktoken releases the GIL) and each id
  written as it comes. A chunk ends only where GPT-2's pre-tokenizer ends a piece whatever follows,
  so the ids are exactly those of the whole text. Compaction needs the corpus's token counts before
  it can renumber: they are counted on the way (np.bincount), the GPT-2 ids kept in a file, and a
  second pass renumbers that file chunk by chunk. Where max_vocab dropped tokens of the corpus, the
  pieces holding one are encoded again (GPT2Tokenizer.compact_ids), so the ids are exactly what the
  tokenizer encodes, and the chunks end where pieces do (`_at_cuts`). A text above SAMPLED_ABOVE
  bytes with a --max_vocab cap is counted on a sample instead (`_sample_counts`: VOCAB_SAMPLE_BYTES
  in slices spread evenly over it): the cap keeps only the most frequent tokens, which a sample of
  millions of tokens ranks as the whole text would, and one pass then encodes the text with the
  fitted vocabulary itself (tiktoken over the kept tokens, faster than GPT-2's). Exact counts would
  cost a second pass over every id (the stage at 2 GB, compacted: 0.65x raw tiktoken's speed with
  them, 0.95x now; docs/performance.md).
- char: a first pass counts the characters (the vocabulary), a second writes their ids.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import tiktoken

from gpt.cores import usable_cores
from gpt.data.cleaning import SEPARATOR
from gpt.errors import InputError
from gpt.rundir.layout import dtype_for
from gpt.tokenizer.compaction import piece_cuts
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer, Tokenizer
from gpt.tokenizer.ranks import ENDOFTEXT, gpt2_encoding

CHUNK_CHARS = 1 << 20  # characters tokenized at a time (per core)
# A chunk with no safe cut this long is tokenized whole (only text without newlines or spaces
# between words gets there).
MAX_CHUNK_CHARS = 1 << 26
ID_CHUNK = 1 << 20  # ids renumbered at a time
# The vocabulary of a large text under a --max_vocab cap is counted on this many bytes of it, in
# VOCAB_SAMPLE_SLICES slices spread evenly (16 MB: about 4 million tokens; the cap's least
# frequent token occurs dozens of times in them). Only above SAMPLED_ABOVE: below, the second
# pass over the exact counts costs less than the sample and a second encoding pass.
VOCAB_SAMPLE_BYTES = 1 << 24
VOCAB_SAMPLE_SLICES = 64
SAMPLED_ABOVE = 4 * VOCAB_SAMPLE_BYTES
SPLITS = ("train", "val")
# Where GPT-2's pre-tokenizer (tokenizer.GPT2_PAT_STR) ends a piece whatever comes after, and
# starts the next one afresh: after a newline between two non-space characters (the newline is a
# piece of its own either way), and before a space between two ASCII letters (the space begins
# the next word's piece). Python's \S is narrower than the pattern's, so these hold there too.
SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=[A-Za-z])(?= [A-Za-z])")
_CUT_WINDOW = 1 << 16
# Items (chunks of about a megabyte) each thread of a worker pool encodes, on average, before new
# threads take over. Measured on 2 cores (27 Nov 2026), the stage on 256 MB took 38.6-40.5 s with
# threads that lived through the whole text and 32.5-32.9 s with two threads replaced every 64
# chunks (alternating runs, four in all; at 2 GB 269 s against 187 s). Why a long-lived encoding
# thread slows is not pinned down (tiktoken keeps 128 copies of its regex, one chosen by the
# thread's id; one thread on its own did not slow with age); new threads cost microseconds. Per
# thread, not per pool, so that a many-core node's new ids reach tiktoken's 128 (and come back
# round to used copies) no sooner than two cores' do: after ~4 GB.
THREAD_ITEMS = 32
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class TokenFiles:
    """What tokenizing wrote: the tokenizer, and per split (train, val) its tokens and bytes."""

    tokenizer: Tokenizer
    tokens: tuple[int, int]
    nbytes: tuple[int, int]
    sample_bytes: int = 0
    """Bytes of the text the vocabulary was counted on, when a sample (0: the whole text)."""


@dataclass
class Chunk:
    """A piece of one split's text: `parts` tokenized one by one, end-of-text between each two
    (one part: no document ends in it), standing for `separator_bytes` bytes of the text's
    document separators besides the parts' own."""

    split: int
    parts: list[str]
    separator_bytes: int = 0


def chunks(path: Path, cut: int, safe: bool, breaks: Iterable[int] = ()) -> Iterator[Chunk]:
    """The UTF-8 text file at `path` in chunks: split 0 is its first `cut` characters, split 1
    the rest. With `safe`, a chunk ends only at a SAFE_CUT, a document's end or its split's end.
    `breaks`: the byte offsets (ascending) of the SEPARATORs between documents, each replaced by
    end-of-text between the documents on either side of it within a split (none at a split's
    start or end; a separator the cut falls in or next to separates nothing)."""
    chunker = _Chunker(cut, safe)
    for text in _pieces(path, iter(breaks)):
        yield from chunker.separator() if text is None else chunker.text(text)
    yield from chunker.end()


def _pieces(path: Path, breaks: Iterator[int]) -> Iterator[str | None]:
    """The text of the file at `path` in pieces, None in place of each SEPARATOR at `breaks`."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    at, next_break = 0, next(breaks, None)
    with open(path, "rb") as f:
        while True:
            size = CHUNK_CHARS if next_break is None else min(CHUNK_CHARS, next_break - at)
            if not size:  # a document ends here (whole characters: the decoder holds none)
                if f.read(len(SEPARATOR)) != SEPARATOR:
                    raise RuntimeError(f"{path}: no document separator at byte {at}")
                at += len(SEPARATOR)
                next_break = next(breaks, None)
                yield None
                continue
            raw = f.read(size)
            if not raw:
                break
            at += len(raw)
            yield decoder.decode(raw)
    if tail := decoder.decode(b"", final=True):
        yield tail


class _Chunker:
    """Cuts a text, given in pieces and separators, into Chunks (see `chunks`)."""

    def __init__(self, cut: int, safe: bool) -> None:
        self.cut, self.safe = cut, safe
        self.split, self.pos = 0, 0  # the split and character offset reached
        self.parts: list[str] = []  # whole documents (or their ends) of the chunk being made
        self.held = 0  # their characters
        self.buf = ""  # the current document's text not yet in a chunk
        self.separator_bytes = 0
        self.has_text = False  # the split has text: a separator now ends a document
        self.ended = False  # a separator ended the document in `buf`

    def text(self, text: str) -> Iterator[Chunk]:
        if self.split == 0 and self.pos + len(text) >= self.cut:
            head, text = text[: self.cut - self.pos], text[self.cut - self.pos :]
            yield from self._add(head)
            yield from self._next_split(len(head))
        self.pos += len(text)
        yield from self._add(text)

    def separator(self) -> Iterator[Chunk]:
        size = len(SEPARATOR)  # as many characters as bytes: ASCII
        if self.split == 0 and self.pos + size >= self.cut:  # the cut falls in it or at its end
            into = self.cut - self.pos
            self.separator_bytes += into
            yield from self._next_split(into)
            self.separator_bytes += size - into
            self.pos += size - into
        else:
            self.separator_bytes += size
            self.ended = self.has_text
            self.pos += size

    def _add(self, text: str) -> Iterator[Chunk]:
        if not text:
            return
        if self.ended:  # a new document: the one in `buf` is whole
            self.parts.append(self.buf)
            self.held += len(self.buf)
            self.buf, self.ended = "", False
        self.buf += text
        self.has_text = True
        while self.held + len(self.buf) >= CHUNK_CHARS:
            if self.parts:  # end the chunk where a document ends (end-of-text last)
                yield self._chunk([*self.parts, ""])
                continue
            end = _last_cut(self.buf) if self.safe else len(self.buf)
            if not end:
                break
            yield self._chunk([self.buf[:end]])
            self.buf = self.buf[end:]

    def _chunk(self, parts: list[str]) -> Chunk:
        chunk = Chunk(self.split, parts, self.separator_bytes)
        self.parts, self.held, self.separator_bytes = [], 0, 0
        return chunk

    def _next_split(self, chars: int) -> Iterator[Chunk]:
        """End the training split, `chars` further on."""
        self.pos += chars
        yield from self.end()
        self.split, self.buf, self.has_text, self.ended = 1, "", False, False

    def end(self) -> Iterator[Chunk]:
        if self.parts or self.buf or self.separator_bytes:
            yield self._chunk([*self.parts, self.buf])
        self.buf = ""


def _last_cut(buf: str) -> int:
    """A safe cut near the end of `buf` (0: none yet, keep reading)."""
    # Fast path, nearly always taken: the last newline near the end between two non-spaces.
    floor = len(buf) - _CUT_WINDOW
    i = buf.rfind("\n", 0, len(buf) - 1)
    while i > max(floor, 0):
        if not buf[i - 1].isspace() and not buf[i + 1].isspace():
            return i + 1
        i = buf.rfind("\n", 0, i)
    for start in (floor, 0):
        last = 0
        for m in SAFE_CUT.finditer(buf, max(start, 1)):
            last = m.start()
        if last:
            return last
    return len(buf) if len(buf) >= MAX_CHUNK_CHARS else 0


def tokenize_file(
    name: str, path: Path, cut: int, compact: bool, max_vocab: int, out: Path,
    progress: Callable[[int, int], None] = lambda nbytes, ntokens: None,
    breaks: Path | None = None,
) -> TokenFiles:
    """Tokenize the text file `path` with tokenizer `name` into `out`/train.bin and val.bin
    (raw ids, meta's dtype); `progress` hears of the bytes and tokens done after each chunk.
    `breaks`: a file of the byte offsets (int64) of the SEPARATORs between the text's documents,
    where GPT-2's ids hold end-of-text instead (`chunks`); characters have no end-of-text, and
    keep the separator as text."""
    if name == "char":
        return _char(path, cut, out, progress)
    if name == "gpt2":
        return _gpt2(path, cut, compact, max_vocab, out, progress, breaks)
    raise ValueError(f"--tokenizer {name!r}: expected gpt2 or char")


def _gpt2(
    path: Path, cut: int, compact: bool, max_vocab: int, out: Path,
    progress: Callable[[int, int], None], breaks: Path | None,
) -> TokenFiles:
    if not compact:
        return _encode_into(GPT2Tokenizer(), path, cut, out, progress, breaks)
    if max_vocab and path.stat().st_size > SAMPLED_ABOVE:
        counts, sample_bytes = _sample_counts(path)
        tok = GPT2Tokenizer.fit_counts(counts, max_vocab)
        return _encode_into(tok, path, cut, out, progress, breaks, sample_bytes=sample_bytes)
    # Exact counts: the GPT-2 ids go to scratch files, counted on the way, then are renumbered.
    counts = np.zeros(gpt2_encoding().n_vocab, dtype=np.int64)
    gpt2 = _encode_into(GPT2Tokenizer(), path, cut, out, progress, breaks, ".{}.gpt2", counts)
    tok = GPT2Tokenizer.fit_counts(counts, max_vocab)
    dtype = dtype_for(tok.vocab_size)
    renumbered = tok.covers(np.flatnonzero(counts))  # no token dropped: a chunk is renumbered

    def renumber(ids: np.ndarray) -> bytes:
        return tok.compact_ids(ids).astype(dtype).tobytes()

    tokens = [0, 0]
    for i, split in enumerate(SPLITS):
        src = out / f".{split}.gpt2"
        # Read, not memory-mapped: the pages of a mapped file count as resident memory.
        with open(src, "rb") as ids, open(out / f"{split}.bin", "wb") as f:
            parts = _read_ids(ids, dtype_for(gpt2.tokenizer.vocab_size))
            for data in _in_order(renumber, parts if renumbered else _at_cuts(parts)):
                f.write(data)
        tokens[i] = (out / f"{split}.bin").stat().st_size // np.dtype(dtype).itemsize
        src.unlink()
    return TokenFiles(tok, tuple(tokens), gpt2.nbytes)


def _sample_counts(path: Path) -> tuple[np.ndarray, int]:
    """How often each GPT-2 id occurs in VOCAB_SAMPLE_SLICES slices of the UTF-8 text file at
    `path`, evenly spread from its start to its end, VOCAB_SAMPLE_BYTES in all, and the bytes
    counted. Each slice is whole lines where it holds a newline (a read may start or end
    inside a character)."""
    enc, size = gpt2_encoding(), path.stat().st_size
    width = VOCAB_SAMPLE_BYTES // VOCAB_SAMPLE_SLICES
    slices = []
    with open(path, "rb") as f:
        for k in range(VOCAB_SAMPLE_SLICES):
            f.seek(k * (size - width) // (VOCAB_SAMPLE_SLICES - 1))
            text = f.read(width).decode("utf-8", errors="ignore")  # only cut characters go
            first, last = text.find("\n"), text.rfind("\n")
            slices.append(text[first + 1 : last + 1] if first < last else text)
    counts = np.zeros(enc.n_vocab, dtype=np.int64)
    for ids in _in_order(lambda t: enc.encode_to_numpy(t, disallowed_special=()), slices):
        counts += np.bincount(ids, minlength=enc.n_vocab)
    return counts, sum(len(t.encode("utf-8")) for t in slices)


def _encode_into(
    tok: GPT2Tokenizer, path: Path, cut: int, out: Path, progress: Callable[[int, int], None],
    breaks: Path | None = None, name: str = "{}.bin", counts: np.ndarray | None = None,
    sample_bytes: int = 0,
) -> TokenFiles:
    """Encode the text at `path` with `tok` into `out`/`name` per split (train.bin, val.bin),
    end-of-text between documents (`breaks`), adding the ids to `counts` if given."""
    tokens, nbytes = [0, 0], [0, 0]
    dtype = dtype_for(tok.vocab_size)
    with (
        open(out / name.format(SPLITS[0]), "wb") as train,
        open(out / name.format(SPLITS[1]), "wb") as val,
    ):
        for split, size, ids in _encoded(tok.bpe, chunks(path, cut, True, _offsets(breaks))):
            (train, val)[split].write(ids.astype(dtype).tobytes())
            if counts is not None:
                counts += np.bincount(ids, minlength=len(counts))
            tokens[split] += len(ids)
            nbytes[split] += size
            progress(size, len(ids))
    return TokenFiles(tok, tuple(tokens), tuple(nbytes), sample_bytes)


OFFSETS = 1 << 16  # document offsets read at a time (as Python ints: ~2 MB)


def _offsets(path: Path | None) -> Iterator[int]:
    """The int64s in the file at `path` (none without one), read OFFSETS at a time."""
    if path is None:
        return
    with open(path, "rb") as f:
        while len(offsets := np.fromfile(f, dtype=np.int64, count=OFFSETS)):
            yield from offsets.tolist()


def _read_ids(f: BinaryIO, dtype: str) -> Iterator[np.ndarray]:
    while len(ids := np.fromfile(f, dtype=dtype, count=ID_CHUNK)):
        yield ids


def _at_cuts(parts: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """The same ids, in parts that end at a `piece_cuts` cut (or the text's end): a piece
    holding a dropped token is encoded again whole, so it must not straddle two parts. (A text
    with no whitespace after a word has no cut: it stays one part.)"""
    rest = np.empty(0, dtype=np.int64)
    for ids in parts:
        ids = np.concatenate([rest, ids]) if len(rest) else ids
        cuts = piece_cuts(ids)
        end = int(cuts[-1]) if len(cuts) else 0
        if end:
            yield ids[:end]
        rest = ids[end:]
    if len(rest):
        yield rest


def _in_order(fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """fn(item) for each item, in order, computed on every usable core (tiktoken and numpy
    release the GIL); at most two items per worker are in flight, so memory stays bounded.
    Every THREAD_ITEMS items per worker, new threads take over from the ones before."""
    # A worker per core, no more: a third encoding thread on two cores cost 16% (50 MB, six
    # interleaved rounds, 27 Nov 2026); this thread's reading, cutting and writing is ~1% of
    # the work. New threads every THREAD_ITEMS: see there.
    workers = usable_cores()
    pending: deque[Future[R]] = deque()
    pool = ThreadPoolExecutor(workers)
    try:
        for n, item in enumerate(items, 1):
            pending.append(pool.submit(fn, item))
            if n % (THREAD_ITEMS * workers) == 0:
                pool.shutdown(wait=False)  # its threads end once their items are done
                pool = ThreadPoolExecutor(workers)
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown()


def _encoded(
    enc: tiktoken.Encoding, parts: Iterator[Chunk]
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(split, bytes of the text, ids) per chunk, in order. The chunks end at safe cuts, which
    hold for any BPE with GPT-2's pre-tokenizer (GPT-2's own, or a compacted vocabulary's), or
    at a document's end; each document is encoded on its own, end-of-text between two.

    One tiktoken call a chunk: its documents joined by "<|endoftext|>", allowed as the one
    special token (tiktoken encodes the text between special tokens apart: the same ids as a
    call per document). ~240 calls a chunk of FineWeb-sized documents took 1.13x the time on
    two threads (80 MB of 4 KB documents, four interleaved rounds, 27 Nov 2026: each call
    takes the GIL back). A chunk where a document spells "<|endoftext|>" is encoded a
    document at a time, the spelling kept as text."""
    eot = np.array([enc.eot_token], dtype=np.uint32)
    eot_only = frozenset({ENDOFTEXT})

    def encode(chunk: Chunk) -> tuple[int, int, np.ndarray]:
        parts = chunk.parts
        joined = ENDOFTEXT.join(parts)  # one part: that part itself
        if joined.count(ENDOFTEXT) == len(parts) - 1:
            ids = enc.encode_to_numpy(joined, allowed_special=eot_only, disallowed_special=())
        else:
            # No special tokens: "<|endoftext|>" in a text is just text (as encode_ordinary).
            ids = np.concatenate([a for text in parts for a in (
                enc.encode_to_numpy(text, disallowed_special=()), eot)][:-1])
        size = chunk.separator_bytes + sum(
            len(text) if text.isascii() else len(text.encode("utf-8")) for text in chunk.parts
        )
        return chunk.split, size, ids

    return _in_order(encode, parts)


def tokenize_with(tok: Tokenizer, path: Path, cut: int, out: Path,
                  progress: Callable[[int, int], None] = lambda nbytes, ntokens: None,
                  breaks: Path | None = None) -> TokenFiles:  # fmt: skip
    """`tokenize_file` with a given tokenizer's vocabulary as it is (a pretrained model's,
    --init_from): GPT-2 BPE, compacted or not, end-of-text between documents; characters,
    refusing one it lacks."""
    if isinstance(tok, GPT2Tokenizer):
        return _encode_into(tok, path, cut, out, progress, breaks)
    return _char(path, cut, out, progress, tok)


def _char(path: Path, cut: int, out: Path, progress: Callable[[int, int], None],
          tok: CharTokenizer | None = None) -> TokenFiles:
    counts = np.zeros(0x110000, dtype=np.int64)
    for _, text in _char_chunks(path, cut):
        counts += np.bincount(_code_points(text), minlength=len(counts))
    present = np.flatnonzero(counts)
    if tok is None:
        tok = CharTokenizer("".join(map(chr, present.tolist())))
    have = np.array([ord(c) for c in tok.chars])
    missing = np.setdiff1d(present, have)
    if len(missing):
        shown = "".join(map(chr, missing[:10].tolist()))
        raise InputError(f"the text holds {len(missing)} character(s) the pretrained model's "
                         f"vocabulary lacks, e.g. {shown!r}")
    lookup = np.zeros(len(counts), dtype=np.int64)
    lookup[have] = np.arange(len(have))
    dtype = dtype_for(tok.vocab_size)
    tokens, nbytes = [0, 0], [0, 0]
    with open(out / "train.bin", "wb") as train, open(out / "val.bin", "wb") as val:
        for split, text in _char_chunks(path, cut):
            ids = lookup[_code_points(text)].astype(dtype)
            (train, val)[split].write(ids.tobytes())
            size = len(text.encode("utf-8"))
            tokens[split] += len(ids)
            nbytes[split] += size
            progress(size, len(ids))
    return TokenFiles(tok, tuple(tokens), tuple(nbytes))


def _char_chunks(path: Path, cut: int) -> Iterator[tuple[int, str]]:
    """(split, text) in chunks; documents keep the blank line between them (no end-of-text)."""
    for chunk in chunks(path, cut, safe=False):
        yield chunk.split, "".join(chunk.parts)


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
