"""Tokenizers: GPT-2 BPE (optionally compacted to the corpus) and characters.

Both turn text into ids and back exactly, and serialise to plain JSON (`to_json`,
`tokenizer_from_json`), which `data/tokenizer.json` holds so later stages rebuild the very same
tokenizer. GPT-2 BPE is built from the ranks file shipped in `gpt/assets/`, checked against its
sha256, and never touches the network or tiktoken's download cache.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken

from gpt.errors import InputError

# OpenAI's r50k_base.tiktoken (= GPT-2's vocabulary), gzipped; sha256 of the decompressed bytes.
RANKS_ASSET = "r50k_base.tiktoken.gz"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer split pattern and its one special token, as in tiktoken_ext.openai_public.
GPT2_PAT_STR = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
GPT2_EOT = 50256


def read_ranks(path: Path) -> dict[bytes, int]:
    """Parse a gzipped `.tiktoken` ranks file (`base64(token) rank` per line), sha256-checked."""
    data = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        # A damaged installation, not bad user input: fail loudly with the evidence.
        raise RuntimeError(f"{path}: sha256 {digest} != expected {RANKS_SHA256}; reinstall")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's BPE as a tiktoken Encoding, built offline from the shipped ranks."""
    with resources.as_file(resources.files("gpt.assets") / RANKS_ASSET) as path:
        ranks = read_ranks(path)
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_EOT + 1,
    )


@functools.cache
def always_kept() -> frozenset[int]:
    """GPT-2 ids every compacted vocabulary keeps: end-of-text, and every single byte (ranks
    0..255 in r50k, but looked up rather than assumed), so that any text can still be spelt."""
    enc = gpt2_encoding()
    return frozenset({GPT2_EOT, *(enc.encode_single_token(bytes([b])) for b in range(256))})


class Tokenizer(ABC):
    """Text <-> ids. `decode(encode(s)) == s` for every string the vocabulary can express."""

    name: str
    vocab_size: int
    eot_id: int | None

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids for `text`; raises ValueError if the vocabulary cannot express it."""

    @abstractmethod
    def encode_lossy(self, text: str) -> tuple[list[int], list[str]]:
        """Ids for `text`, replacing what the vocabulary lacks; also returns what was replaced."""

    @abstractmethod
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The UTF-8 bytes of `ids` (a token may hold part of a multi-byte character)."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """Everything needed to rebuild this tokenizer, as JSON-able values."""

    def decode(self, ids: Iterable[int]) -> str:
        # Sampled ids may end mid-character; encode()'s ids always decode strictly.
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        return ids


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE. With `kept` (sorted GPT-2 ids), the vocabulary is compacted to those ids,
    renumbered densely in GPT-2 order; a BPE token outside it is re-spelt with kept tokens only
    (BPE merges restricted to the kept vocabulary, down to single bytes, which are always kept),
    so any text still encodes and decodes exactly."""

    name = "gpt2"

    def __init__(self, kept: Sequence[int] | None = None) -> None:
        self.enc = gpt2_encoding()
        self.kept = None if kept is None else [int(i) for i in kept]
        n = self.enc.n_vocab
        if self.kept is None:
            self.vocab_size = n
            self._to_gpt2 = None
            self._from_gpt2 = None
        else:
            _check_kept(self.kept, n)
            self.vocab_size = len(self.kept)
            self._to_gpt2 = np.array(self.kept, dtype=np.int64)
            self._from_gpt2 = np.full(n, -1, dtype=np.int64)
            self._from_gpt2[self._to_gpt2] = np.arange(self.vocab_size)
            # bytes -> GPT-2 id of every kept token: what re-spelling a dropped token merges into
            self._kept_ids = {self.enc.decode_single_token_bytes(g): g for g in self.kept}
            self._spellings: dict[int, list[int]] = {}
        self.eot_id = self._compact([GPT2_EOT])[0]

    @classmethod
    def fit(cls, texts: Iterable[str], max_vocab: int = 0) -> GPT2Tokenizer:
        """The compacted tokenizer for a corpus: all 256 bytes, end-of-text, and its BPE tokens,
        only the `max_vocab` most frequent of them all if `max_vocab` is set."""
        enc = gpt2_encoding()
        counts = np.zeros(enc.n_vocab, dtype=np.int64)
        for text in texts:
            ids = np.asarray(enc.encode_ordinary(text), dtype=np.int64)
            counts += np.bincount(ids, minlength=len(counts))
        return cls.fit_counts(counts, max_vocab)

    @classmethod
    def fit_counts(cls, counts: np.ndarray, max_vocab: int = 0) -> GPT2Tokenizer:
        """`fit` from how often each GPT-2 id occurs in the corpus (what a streamed corpus
        keeps instead of its ids)."""
        required = always_kept()
        if max_vocab and max_vocab < len(required):
            raise ValueError(f"max_vocab {max_vocab}: must be 0 (no limit) or >= {len(required)}")
        counts = np.array(counts, dtype=np.int64)
        counts[list(required)] = 0  # kept anyway: rank only the others
        used = np.flatnonzero(counts)
        if max_vocab:
            # Most frequent first, ties to the lower (earlier-merged) id: deterministic.
            used = used[np.lexsort((used, -counts[used]))][: max_vocab - len(required)]
        return cls(sorted(required | set(used.tolist())))

    def _compact(self, gpt2_ids: Sequence[int]) -> list[int]:
        return self.compact_ids(np.asarray(gpt2_ids, dtype=np.int64)).tolist()

    def compact_ids(self, gpt2_ids: np.ndarray) -> np.ndarray:
        """This vocabulary's ids (int64) for GPT-2 ids, each one outside it re-spelt with kept
        tokens (`_respell`); vectorised, for a corpus's millions of ids."""
        gpt2_ids = np.asarray(gpt2_ids, dtype=np.int64)
        if self._from_gpt2 is None:
            return gpt2_ids
        ids = self._from_gpt2[gpt2_ids]
        missing = ids < 0
        if not missing.any():
            return ids
        # Every occurrence of a dropped token becomes its spelling: lay the spellings out flat,
        # then copy each occurrence's into its place in the output.
        dropped, which = np.unique(gpt2_ids[missing], return_inverse=True)
        spellings = [self._respell(g) for g in dropped.tolist()]
        lens = np.array([len(sp) for sp in spellings], dtype=np.int64)
        flat = np.array([i for sp in spellings for i in sp], dtype=np.int64)
        offsets = np.cumsum(lens) - lens
        sizes = np.ones(len(ids), dtype=np.int64)
        sizes[missing] = lens[which]
        starts = np.cumsum(sizes) - sizes
        out = np.empty(int(sizes.sum()), dtype=np.int64)
        out[starts[~missing]] = ids[~missing]
        n = lens[which]
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        out[np.repeat(starts[missing], n) + within] = flat[np.repeat(offsets[which], n) + within]
        return out

    def _respell(self, gpt2_id: int) -> list[int]:
        """Compact ids for a GPT-2 token outside the vocabulary (unseen in the corpus, or cut by
        max_vocab): its bytes merged by BPE over kept tokens only. Cached per token."""
        if gpt2_id not in self._spellings:
            parts = [bytes([b]) for b in self.enc.decode_single_token_bytes(gpt2_id)]
            while len(parts) > 1:
                # As BPE does: merge the adjacent pair forming the kept token of lowest rank
                # (= GPT-2 id); stop when no adjacent pair forms a kept token.
                merges = [
                    (self._kept_ids[a + b], i)
                    for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
                    if a + b in self._kept_ids
                ]
                if not merges:
                    break
                _, i = min(merges)
                parts[i : i + 2] = [parts[i] + parts[i + 1]]
            self._spellings[gpt2_id] = self._from_gpt2[[self._kept_ids[p] for p in parts]].tolist()
        return self._spellings[gpt2_id]

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: "<|endoftext|>" typed in a text is just text, so round-trips hold.
        return self._compact(self.enc.encode_ordinary(text))

    def encode_lossy(self, text: str) -> tuple[list[int], list[str]]:
        return self.encode(text), []  # bytes cover everything: nothing is ever replaced

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = self._check_ids(ids)
        if self._to_gpt2 is not None:
            ids = self._to_gpt2[np.asarray(ids, dtype=np.int64)].tolist()
        return self.enc.decode_bytes(ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ranks_sha256": RANKS_SHA256,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "kept": self.kept,
        }


def _check_kept(kept: list[int], n_vocab: int) -> None:
    if any(b <= a for a, b in zip(kept, kept[1:], strict=False)):
        raise ValueError("kept: GPT-2 ids must be strictly increasing")
    if kept and not (0 <= kept[0] and kept[-1] < n_vocab):
        raise ValueError(f"kept: GPT-2 ids must lie in [0, {n_vocab})")
    if not always_kept() <= set(kept):
        raise ValueError("kept: must contain all 256 single-byte tokens and end-of-text")


class CharTokenizer(Tokenizer):
    """One id per character of the corpus (nanoGPT's shakespeare_char), no end-of-text."""

    name = "char"
    eot_id = None

    def __init__(self, chars: str) -> None:
        if not chars or len(set(chars)) != len(chars):
            raise ValueError("chars: must be a non-empty string of distinct characters")
        self.chars = chars
        self.vocab_size = len(chars)
        self._ids = {c: i for i, c in enumerate(chars)}
        # What encode_lossy writes for a character it lacks: something neutral if there is one.
        self._fill = next((c for c in "? " if c in self._ids), chars[0])

    @classmethod
    def fit(cls, texts: Iterable[str]) -> CharTokenizer:
        return cls("".join(sorted(set().union(*map(set, texts)))))

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self._ids.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(unknown)!r}")
        return [self._ids[c] for c in text]

    def encode_lossy(self, text: str) -> tuple[list[int], list[str]]:
        replaced = [c for c in text if c not in self._ids]
        ids = [self._ids.get(c, self._ids[self._fill]) for c in text]
        return ids, replaced

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return "".join(self.chars[i] for i in self._check_ids(ids)).encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "chars": self.chars}


def tokenizer_from_json(obj: dict[str, Any]) -> Tokenizer:
    """Rebuild what `to_json` wrote; ValueError if it is not a tokenizer this code can rebuild."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    name = obj.get("name")
    if name == "char":
        tok: Tokenizer = CharTokenizer(obj.get("chars", ""))
    elif name == "gpt2":
        if obj.get("ranks_sha256") != RANKS_SHA256:
            raise ValueError(f"ranks_sha256 {obj.get('ranks_sha256')!r}: not the shipped GPT-2 BPE")
        tok = GPT2Tokenizer(obj.get("kept"))
    else:
        raise ValueError(f"name {name!r}: expected 'gpt2' or 'char'")
    if "vocab_size" in obj and obj["vocab_size"] != tok.vocab_size:
        raise ValueError(f"vocab_size {obj['vocab_size']} != {tok.vocab_size} rebuilt")
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a `tokenizer.json`; a missing or malformed file is an InputError naming it."""
    path = Path(path)
    try:
        return tokenizer_from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(f"{path}: no such tokenizer file (run the corpus stage first)") from None
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a valid tokenizer file: {e}") from None
