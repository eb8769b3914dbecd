"""The tokenizers a run can have: GPT-2 BPE (optionally compacted to the corpus,
compaction.py; with the chat format's two markers appended, chat.py) and characters.

Both turn text into ids and back exactly, and serialise to plain JSON (`to_json`,
`tokenizer_from_json`), which `data/tokenizer.json` holds so later stages rebuild the very same
tokenizer (their Hugging Face form: huggingface.py).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken

from gpt.errors import InputError
from gpt.tokenizer.chat import MARKERS
from gpt.tokenizer.compaction import Compaction, kept_ids
from gpt.tokenizer.ranks import RANKS_SHA256, gpt2_encoding


class Tokenizer(ABC):
    """Text <-> ids. `decode(encode(s)) == s` for every string the vocabulary can express."""

    name: str
    vocab_size: int
    eot_id: int | None
    chat: bool = False
    """The chat format's markers (gpt/tokenizer/chat.py) are its last ids."""

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
    """GPT-2 BPE. With `kept` (sorted GPT-2 ids, merge-closed), BPE over those tokens only
    (compaction.py): on a text whose GPT-2 tokens are all kept it gives GPT-2's tokens
    renumbered, and any other text still encodes and decodes exactly (the 256 bytes are always
    kept). With `chat`, the chat format's markers follow as two special tokens, whatever was
    kept: text never encodes to them (`encode` spells their spelling as text)."""

    name = "gpt2"

    def __init__(self, kept: Sequence[int] | None = None, chat: bool = False) -> None:
        self.enc = gpt2_encoding()
        self.compaction = None if kept is None else Compaction(kept)
        self.kept = None if self.compaction is None else self.compaction.kept
        self.bpe = self.enc if self.compaction is None else self.compaction.bpe
        self.chat = chat
        if chat:
            self.bpe = _with_markers(self.bpe)
        self.vocab_size = self.bpe.n_vocab
        self.eot_id = self.bpe.eot_token

    @classmethod
    def fit(cls, texts: Iterable[str], max_vocab: int = 0) -> GPT2Tokenizer:
        """The compacted tokenizer for a corpus: all 256 bytes, end-of-text, and its BPE tokens
        with the tokens they are merged from, only the most frequent of them that fit in
        `max_vocab` if it is set."""
        enc = gpt2_encoding()
        counts = np.zeros(enc.n_vocab, dtype=np.int64)
        for text in texts:
            ids = np.asarray(enc.encode_ordinary(text), dtype=np.int64)
            counts += np.bincount(ids, minlength=len(counts))
        return cls.fit_counts(counts, max_vocab)

    @classmethod
    def fit_counts(cls, counts: np.ndarray, max_vocab: int = 0, chat: bool = False
                   ) -> GPT2Tokenizer:  # fmt: skip
        """`fit` from how often each GPT-2 id occurs in the corpus (`kept_ids`)."""
        return cls(kept_ids(counts, max_vocab), chat)

    def base_size(self) -> int:
        """The ids before the chat markers: the BPE vocabulary, end-of-text included."""
        return self.vocab_size - len(MARKERS) if self.chat else self.vocab_size

    def covers(self, gpt2_ids: np.ndarray) -> bool:
        """Whether every one of `gpt2_ids` is kept: then a text of them encodes to them
        renumbered."""
        return self.compaction is None or self.compaction.covers(gpt2_ids)

    def compact_ids(self, gpt2_ids: np.ndarray) -> np.ndarray:
        """`encode`'s ids (int64) for the text whose GPT-2 ids are `gpt2_ids`, without decoding
        it (`Compaction.compact_ids`)."""
        gpt2_ids = np.asarray(gpt2_ids, dtype=np.int64)
        return gpt2_ids if self.compaction is None else self.compaction.compact_ids(gpt2_ids)

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: "<|endoftext|>" typed in a text is just text, so round-trips hold.
        return self.bpe.encode_ordinary(text)

    def encode_lossy(self, text: str) -> tuple[list[int], list[str]]:
        return self.encode(text), []  # bytes cover everything: nothing is ever replaced

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.bpe.decode_bytes(self._check_ids(ids))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ranks_sha256": RANKS_SHA256,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "kept": self.kept,
            **({"chat": True} if self.chat else {}),  # a text tokenizer's file as it was
        }


def _with_markers(bpe: tiktoken.Encoding) -> tiktoken.Encoding:
    """`bpe` with the chat markers as special tokens after its last id (tiktoken's documented
    way to extend an Encoding)."""
    n = bpe.n_vocab
    return tiktoken.Encoding(
        name=f"{bpe.name}-chat",
        pat_str=bpe._pat_str,
        mergeable_ranks=bpe._mergeable_ranks,
        special_tokens={**bpe._special_tokens, **{m: n + i for i, m in enumerate(MARKERS)}},
        explicit_n_vocab=n + len(MARKERS),
    )


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
        tok = GPT2Tokenizer(obj.get("kept"), chat=obj.get("chat") is True)
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
