"""Tokenizers: GPT-2 BPE (optionally compacted to the corpus) and characters.

Both turn text into ids and back exactly, and serialise to plain JSON (`to_json`,
`tokenizer_from_json`), which `data/tokenizer.json` holds so later stages rebuild the very same
tokenizer, and to an equivalent Hugging Face `tokenizers.Tokenizer` (`to_hf`, and back with
`tokenizer_from_hf`). GPT-2 BPE is built from the ranks file shipped in `gpt/assets/`, checked
against its sha256, and never touches the network or tiktoken's download cache.
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
from typing import TYPE_CHECKING, Any

import numpy as np
import tiktoken

from gpt.errors import InputError

if TYPE_CHECKING:
    import tokenizers

# OpenAI's r50k_base.tiktoken (= GPT-2's vocabulary), gzipped; sha256 of the decompressed bytes.
RANKS_ASSET = "r50k_base.tiktoken.gz"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer split pattern and its one special token, as in tiktoken_ext.openai_public.
GPT2_PAT_STR = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
GPT2_EOT = 50256
# Unicode's White_Space, what `\s` matches in tiktoken's regex engine.
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}


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
def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's tokens and their ranks (= ids), from the shipped ranks file."""
    with resources.as_file(resources.files("gpt.assets") / RANKS_ASSET) as path:
        return read_ranks(path)


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's BPE as a tiktoken Encoding, built offline from the shipped ranks."""
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=gpt2_ranks(),
        special_tokens={ENDOFTEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_EOT + 1,
    )


@functools.cache
def gpt2_tokens() -> tuple[bytes, ...]:
    """The bytes of every GPT-2 token by id (end-of-text spelt out)."""
    tokens = dict.fromkeys(range(GPT2_EOT + 1), ENDOFTEXT.encode())
    tokens.update((t, g) for g, t in gpt2_ranks().items())
    return tuple(tokens.values())


@functools.cache
def merge_parts(gpt2_id: int) -> tuple[int, int] | None:
    """The two GPT-2 tokens BPE merges into `gpt2_id` (None for a byte or end-of-text): its bytes
    split by BPE over the tokens of lower rank only, as transformers' TikTokenConverter derives
    GPT-2's merges. A vocabulary holding both parts of each of its tokens is merge-closed: BPE
    over it merges as GPT-2's does wherever a text's GPT-2 tokens are all in it."""
    ranks, token = gpt2_ranks(), gpt2_tokens()[gpt2_id]
    if gpt2_id == GPT2_EOT or len(token) == 1:
        return None
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        rank, i = min(
            (ranks.get(a + b, gpt2_id), i)
            for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
        )
        if rank >= gpt2_id:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise RuntimeError(f"GPT-2 token {gpt2_id} {token!r}: lower ranks split it in {parts}")
    return ranks[parts[0]], ranks[parts[1]]


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

    @abstractmethod
    def to_hf(self) -> tokenizers.Tokenizer:
        """A Hugging Face tokenizer giving the same ids (tokenizers is imported only here: the
        training stage never needs it)."""

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
    """GPT-2 BPE. With `kept` (sorted GPT-2 ids, merge-closed: see `merge_parts`), BPE over
    those tokens only, renumbered densely in GPT-2 order so merge priorities stay GPT-2's: on a
    text whose GPT-2 tokens are all kept it gives GPT-2's tokens renumbered, and any other text
    still encodes and decodes exactly (the 256 bytes are always kept)."""

    name = "gpt2"

    def __init__(self, kept: Sequence[int] | None = None) -> None:
        self.enc = gpt2_encoding()
        self.kept = None if kept is None else [int(i) for i in kept]
        n = self.enc.n_vocab
        if self.kept is None:
            self.vocab_size = n
            self.bpe = self.enc
            self._to_gpt2 = None
            self._from_gpt2 = None
        else:
            _check_kept(self.kept, n)
            self.vocab_size = len(self.kept)
            self._to_gpt2 = np.array(self.kept, dtype=np.int64)
            self._from_gpt2 = np.full(n, -1, dtype=np.int64)
            self._from_gpt2[self._to_gpt2] = np.arange(self.vocab_size)
            self.bpe = _restricted_encoding(self.kept)
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
    def fit_counts(cls, counts: np.ndarray, max_vocab: int = 0) -> GPT2Tokenizer:
        """`fit` from how often each GPT-2 id occurs in the corpus (what a streamed corpus
        keeps instead of its ids). Tokens join most frequent first (ties: the lower id), each
        with its missing merge parts (`merge_closure`); with `max_vocab`, one whose closure no
        longer fits is skipped, so the vocabulary stays merge-closed and within the bound."""
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
        return cls(sorted(kept))

    def covers(self, gpt2_ids: np.ndarray) -> bool:
        """Whether every one of `gpt2_ids` is kept: then a text of them encodes to them
        renumbered."""
        return self._from_gpt2 is None or bool((self._from_gpt2[gpt2_ids] >= 0).all())

    def compact_ids(self, gpt2_ids: np.ndarray) -> np.ndarray:
        """`encode`'s ids (int64) for the text whose GPT-2 ids are `gpt2_ids` (a whole text, or
        a part of one cut at `piece_cuts`; or documents encoded apart, end-of-text between
        them), without decoding it: vectorised, for a corpus's millions of ids. Kept ids are
        renumbered; only the pieces between cuts that hold a dropped id are decoded and encoded
        again, in one call per document."""
        gpt2_ids = np.asarray(gpt2_ids, dtype=np.int64)
        if self._from_gpt2 is None:
            return gpt2_ids
        ids = self._from_gpt2[gpt2_ids]
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
        ends = np.searchsorted(np.cumsum(_lengths()[self._to_gpt2[new]]), run_ends) + 1
        return new, np.diff(ends, prepend=0)

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
        }

    def to_hf(self) -> tokenizers.Tokenizer:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        gpt2_ids = range(self.vocab_size) if self.kept is None else self.kept
        vocab = {_hf_spelling(g): i for i, g in enumerate(gpt2_ids)}
        # Ordered by the merged token's rank, so merge priorities are GPT-2's.
        merges = [
            (_hf_spelling(a), _hf_spelling(b)) for a, b in filter(None, map(merge_parts, gpt2_ids))
        ]
        # ignore_merges: a piece that is itself a token is taken whole, as tiktoken does.
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(GPT2_PAT_STR), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
        return tok


@functools.cache
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's printable stand-in for each byte (`bytes_to_unicode` in OpenAI's encoder.py,
    tokenizers' ByteLevel alphabet): printable Latin-1 bytes stand for themselves, the others
    for 256 + their order among them."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = (b for b in range(256) if b not in printable)
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return tuple(chars[b] for b in range(256))


def _hf_spelling(gpt2_id: int) -> str:
    """A GPT-2 token as tokenizers' byte-level BPE spells it."""
    if gpt2_id == GPT2_EOT:
        return ENDOFTEXT
    return "".join(byte_alphabet()[b] for b in gpt2_tokens()[gpt2_id])


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

    def to_hf(self) -> tokenizers.Tokenizer:
        from tokenizers import Tokenizer, decoders, models

        # BPE without merges over the whole text: one token per character; Fuse joins them.
        tok = Tokenizer(models.BPE({c: i for i, c in enumerate(self.chars)}, []))
        tok.decoder = decoders.Fuse()
        return tok


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


def tokenizer_from_hf(obj: dict[str, Any]) -> Tokenizer:
    """Rebuild, from a Hugging Face `tokenizer.json` (as a dict), the tokenizer whose `to_hf`
    wrote it; ValueError for any other tokenizer, naming what differs."""
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise ValueError("tokenizer.json: expected a JSON object with a model")
    decoder = (obj.get("decoder") or {}).get("type")
    vocab = obj["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError(f"tokenizer.json: model {obj['model'].get('type')!r} has no vocab")
    spellings = sorted(vocab, key=vocab.__getitem__)
    if decoder == "ByteLevel":
        tok: Tokenizer = GPT2Tokenizer(_gpt2_kept(spellings))
    elif decoder == "Fuse":
        if any(len(c) != 1 for c in spellings):
            raise ValueError("tokenizer.json: a Fuse-decoded vocabulary must hold characters")
        tok = CharTokenizer("".join(spellings))
    else:
        raise ValueError(f"tokenizer.json: decoder {decoder!r}: expected ByteLevel or Fuse")
    ours = json.loads(tok.to_hf().to_str())
    for key in ("normalizer", "pre_tokenizer", "model", "decoder"):
        if obj.get(key) != ours[key]:
            raise ValueError(f"tokenizer.json: its {key} is not the one {tok.name} writes")
    if not _adds_nothing(obj.get("post_processor")):
        raise ValueError("tokenizer.json: its post_processor adds tokens; ours adds none")
    if [t["content"] for t in obj.get("added_tokens", [])] != [
        t["content"] for t in ours["added_tokens"]
    ]:
        raise ValueError(f"tokenizer.json: its added tokens are not the ones {tok.name} writes")
    return tok


def _adds_nothing(post_processor: dict[str, Any] | None) -> bool:
    """Whether a post-processor leaves the ids as they are: none, or the identity template that
    transformers' `save_pretrained` writes for a tokenizer with no BOS/EOS to add."""
    if post_processor is None:
        return True
    identity = [{"Sequence": {"id": "A", "type_id": 0}}]
    return (post_processor.get("type") == "TemplateProcessing"
            and post_processor.get("single") == identity
            and not post_processor.get("special_tokens"))  # fmt: skip


def _gpt2_kept(spellings: list[str]) -> list[int] | None:
    """The GPT-2 ids of byte-level BPE tokens in id order (None: all of GPT-2's, in its order)."""
    byte = {c: b for b, c in enumerate(byte_alphabet())}
    ranks = gpt2_ranks()
    kept = []
    for s in spellings:
        token = bytes(byte[c] for c in s) if set(s) <= byte.keys() else None
        if s == ENDOFTEXT:
            kept.append(GPT2_EOT)
        elif token in ranks:
            kept.append(ranks[token])
        else:
            raise ValueError(f"tokenizer.json: vocab token {s!r} is not a GPT-2 token")
    if kept != sorted(kept):
        raise ValueError("tokenizer.json: vocab ids are not in GPT-2's order")
    return None if kept == list(range(GPT2_EOT + 1)) else kept


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a `tokenizer.json`; a missing or malformed file is an InputError naming it."""
    path = Path(path)
    try:
        return tokenizer_from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(f"{path}: no such tokenizer file (run the corpus stage first)") from None
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a valid tokenizer file: {e}") from None


def pretrained_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a pretrained model's folder (--init_from): one this project's export
    wrote (`tokenizer_from_hf`), or GPT-2's own, recognised by its vocabulary (every GPT-2 token
    in GPT-2's order, byte-level: transformers' `tokenizer.json`, or the `vocab.json` the Hub's
    GPT-2 also holds), which is the shipped GPT-2 BPE itself. InputError naming the folder for
    anything else."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    try:
        if path.is_file():
            obj = json.loads(path.read_text(encoding="utf-8"))
            try:
                return tokenizer_from_hf(obj)
            except ValueError as ours:
                model = obj.get("model") if isinstance(obj, dict) else None
                byte_level = (obj.get("decoder") or {}).get("type") == "ByteLevel"
                if isinstance(model, dict) and model.get("type") == "BPE" and byte_level:
                    return _gpt2_itself(model.get("vocab"), path)
                raise ValueError(f"{ours}; nor is it GPT-2's") from None
        path = folder / "vocab.json"
        if path.is_file():
            return _gpt2_itself(json.loads(path.read_text(encoding="utf-8")), path)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not a tokenizer this project can use: {e}") from None
    raise InputError(f"{folder}: no tokenizer.json (nor GPT-2's vocab.json)")


def _gpt2_itself(vocab: Any, path: Path) -> GPT2Tokenizer:
    """GPT-2's BPE, if `vocab` (token spelling -> id) is GPT-2's own, else ValueError."""
    if not isinstance(vocab, dict):
        raise ValueError("no vocab")
    if _gpt2_kept(sorted(vocab, key=vocab.__getitem__)) is not None or len(vocab) != GPT2_EOT + 1:
        raise ValueError(f"its {len(vocab):,}-token vocabulary is not GPT-2's")
    return GPT2Tokenizer()
