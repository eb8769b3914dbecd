"""GPT-2's BPE compacted to a corpus: the ids a corpus keeps (merge-closed, the 256 bytes and
end-of-text always), BPE over those alone (`Compaction.bpe`, GPT-2's merge priorities), and a
corpus's GPT-2 ids renumbered to the kept ones without decoding them (`Compaction.compact_ids`,
vectorised; only the pieces holding a dropped token are encoded again)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import tiktoken

from gpt.tokenizer.ranks import (
    ENDOFTEXT,
    GPT2_EOT,
    GPT2_PAT_STR,
    gpt2_encoding,
    gpt2_tokens,
    merge_parts,
)

# Unicode's White_Space, what `\s` matches in tiktoken's regex engine.
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}


def merge_closure(gpt2_id: int, kept: set[int] | frozenset[int]) -> set[int]:
    """`gpt2_id` and the tokens BPE passes through to build it, less those already `kept`."""
    missing, todo = set(), [gpt2_id]
    while todo:
        g = todo.pop()
        if g not in kept and g not in missing:
            missing.add(g)
            todo.extend(merge_parts(g) or ())
    return missing


@functools.cache
def _edges() -> tuple[np.ndarray, np.ndarray]:
    """Per GPT-2 id: does the token end with a whole non-whitespace character, and does it
    start with an ASCII whitespace byte. Unsure cases (a partial character, a character that
    some engine deems whitespace) count as neither, which only cuts less."""

    def last_char(token: bytes) -> str:
        for k in range(1, min(4, len(token)) + 1):
            try:
                return token[-k:].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return " "

    tokens = gpt2_tokens()
    ends_word = np.array(
        [not (c.isspace() or c in WHITE_SPACE) for c in map(last_char, tokens)], dtype=bool
    )
    starts_space = np.array([t[:1] in (b"\t", b"\n", b"\v", b"\f", b"\r", b" ") for t in tokens])
    return ends_word, starts_space


@functools.cache
def _lengths() -> np.ndarray:
    """Bytes per GPT-2 token, by id."""
    return np.array([len(t) for t in gpt2_tokens()], dtype=np.int64)


def piece_cuts(gpt2_ids: np.ndarray) -> np.ndarray:
    r"""Indices i where the text behind `gpt2_ids` may be cut before token i and each side
    encoded alone, by any BPE with GPT2_PAT_STR: where a non-whitespace character meets
    whitespace. No alternative of the pattern spans such a point (those holding non-whitespace
    admit only a leading space), and none matches differently at the end of the left side
    (`$` and `(?!\S)` follow whitespace only). After whitespace no cut is safe: "\n\n" ends a
    text as one piece, but before "x" as two. And on either side of end-of-text, which stands
    between documents encoded apart (gpt/data/tokenfiles.py)."""
    ends_word, starts_space = _edges()
    cut = np.zeros(len(gpt2_ids) + 1, dtype=bool)
    cut[1:-1] = ends_word[gpt2_ids[:-1]] & starts_space[gpt2_ids[1:]]
    eot = np.flatnonzero(gpt2_ids == GPT2_EOT)
    cut[eot] = cut[eot + 1] = True
    cut[0] = cut[-1] = False
    # A mask, not np.union1d: its hashing took ~0.5 s per million ids (numpy 2), more than
    # renumbering them (a corpus of records has an end-of-text every few hundred ids).
    return np.flatnonzero(cut)


@functools.cache
def always_kept() -> frozenset[int]:
    """GPT-2 ids every compacted vocabulary keeps: end-of-text, and every single byte (ranks
    0..255 in r50k, but looked up rather than assumed), so that any text can still be spelt."""
    enc = gpt2_encoding()
    return frozenset({GPT2_EOT, *(enc.encode_single_token(bytes([b])) for b in range(256))})


def kept_ids(counts: np.ndarray, max_vocab: int = 0) -> list[int]:
    """The GPT-2 ids a corpus keeps, from how often each occurs in it (what a streamed corpus
    keeps instead of its ids): all 256 bytes, end-of-text, and its BPE tokens most frequent
    first (ties: the lower id), each with its missing merge parts (`merge_closure`); with
    `max_vocab`, one whose closure no longer fits is skipped, so the vocabulary stays
    merge-closed and within the bound."""
    required = always_kept()
    if max_vocab and max_vocab < len(required):
        raise ValueError(f"max_vocab {max_vocab}: must be 0 (no limit) or >= {len(required)}")
    counts = np.array(counts, dtype=np.int64)
    counts[list(required)] = 0  # kept anyway: rank only the others
    used = np.flatnonzero(counts)
    used = used[np.lexsort((used, -counts[used]))]
    kept = set(required)
    for g in used.tolist():
        if max_vocab and len(kept) == max_vocab:
            break
        missing = merge_closure(g, kept)
        if not max_vocab or len(kept) + len(missing) <= max_vocab:
            kept |= missing
    return sorted(kept)


class Compaction:
    """A compacted GPT-2 vocabulary: `kept` (sorted GPT-2 ids, merge-closed: see `merge_parts`)
    renumbered densely in GPT-2 order, so merge priorities stay GPT-2's."""

    def __init__(self, kept: Sequence[int]) -> None:
        self.kept = [int(i) for i in kept]
        self.enc = gpt2_encoding()
        _check_kept(self.kept, self.enc.n_vocab)
        self.to_gpt2 = np.array(self.kept, dtype=np.int64)
        self.from_gpt2 = np.full(self.enc.n_vocab, -1, dtype=np.int64)
        self.from_gpt2[self.to_gpt2] = np.arange(len(self.kept))
        self.bpe = _restricted_encoding(self.kept)

    def covers(self, gpt2_ids: np.ndarray) -> bool:
        """Whether every one of `gpt2_ids` is kept: then a text of them encodes to them
        renumbered."""
        return bool((self.from_gpt2[gpt2_ids] >= 0).all())

    def compact_ids(self, gpt2_ids: np.ndarray) -> np.ndarray:
        """The compacted ids (int64) of the text whose GPT-2 ids are `gpt2_ids` (a whole text,
        or a part of one cut at `piece_cuts`; or documents encoded apart, end-of-text between
        them), without decoding it: vectorised, for a corpus's millions of ids. Kept ids are
        renumbered; only the pieces between cuts that hold a dropped id are decoded and encoded
        again, in one call per document."""
        ids = self.from_gpt2[gpt2_ids]
        dropped = ids < 0
        if not dropped.any():
            return ids
        redo = _pieces_holding(gpt2_ids, dropped)
        new, sizes = self._encode_runs(gpt2_ids, redo)
        return _splice(ids, redo, new, sizes)

    def _encode_runs(self, gpt2_ids: np.ndarray, redo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This vocabulary's ids for the runs of consecutive `redo` ids, and how many each run
        has. The runs of a document are encoded joined, in one call: within a document a run
        ends with non-whitespace and the next starts with whitespace, a cut, so each run's ids
        end where its bytes do (end-of-text, never redone, ends a document)."""
        document = np.cumsum(gpt2_ids == GPT2_EOT)[redo]
        runs = np.split(gpt2_ids[redo], 1 + np.flatnonzero(np.diff(document)))
        new = np.concatenate([
            self.bpe.encode_to_numpy(self.enc.decode_bytes(ids.tolist()).decode("utf-8"),
                                     disallowed_special=())
            for ids in runs
        ]).astype(np.int64)
        last = redo & ~np.r_[redo[1:], False]
        run_ends = np.cumsum(_lengths()[gpt2_ids[redo]])[np.flatnonzero(last[redo])]
        ends = np.searchsorted(np.cumsum(_lengths()[self.to_gpt2[new]]), run_ends) + 1
        return new, np.diff(ends, prepend=0)


def _restricted_encoding(kept: list[int]) -> tiktoken.Encoding:
    """BPE over the `kept` GPT-2 tokens only, ranked by their compact ids."""
    tokens = gpt2_tokens()
    return tiktoken.Encoding(
        name="gpt2-compact",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks={tokens[g]: i for i, g in enumerate(kept) if g != GPT2_EOT},
        special_tokens={ENDOFTEXT: kept.index(GPT2_EOT)},
        explicit_n_vocab=len(kept),
    )


def _pieces_holding(gpt2_ids: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """Which ids lie in a piece (between `piece_cuts`) that holds a `dropped` one."""
    piece = np.zeros(len(gpt2_ids), dtype=np.int64)
    piece[piece_cuts(gpt2_ids)] = 1
    piece = np.cumsum(piece)
    holding = np.zeros(piece[-1] + 1, dtype=bool)
    holding[piece[dropped]] = True
    return holding[piece]


def _splice(ids: np.ndarray, redo: np.ndarray, new: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`ids` with each run of consecutive `redo` ones replaced by its `sizes[k]` ids of `new`:
    each kept id is one output item, each run one item of its size; laid out by cumsum."""
    first = redo & ~np.r_[False, redo[:-1]]
    item = ~redo | first
    size = np.ones(len(ids), dtype=np.int64)
    size[first] = sizes
    size = size[item]
    start = np.cumsum(size) - size
    is_run = first[item]
    out = np.empty(int(size.sum()), dtype=np.int64)
    out[start[~is_run]] = ids[~redo]
    new_start = np.cumsum(sizes) - sizes
    out[np.repeat(start[is_run] - new_start, sizes) + np.arange(len(new))] = new
    return out


def _check_kept(kept: list[int], n_vocab: int) -> None:
    if any(b <= a for a, b in zip(kept, kept[1:], strict=False)):
        raise ValueError("kept: GPT-2 ids must be strictly increasing")
    if kept and not (0 <= kept[0] and kept[-1] < n_vocab):
        raise ValueError(f"kept: GPT-2 ids must lie in [0, {n_vocab})")
    if not always_kept() <= set(kept):
        raise ValueError("kept: must contain all 256 single-byte tokens and end-of-text")
    have = set(kept)
    open_ = next((g for g in kept if not have.issuperset(merge_parts(g) or ())), None)
    if open_ is not None:
        raise ValueError(
            f"kept: GPT-2 token {open_} lacks its merge parts {merge_parts(open_)} "
            "(a vocabulary from before merge closure: run load-corpus again)"
        )
