"""The tokenizers' Hugging Face form: a `tokenizers.Tokenizer` giving the same ids (`to_hf`,
what the export's `tokenizer.json` holds), and back (`tokenizer_from_hf`). `tokenizers` is
imported only when one is made: the training stage never needs it."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from gpt.tokenizer.chat import MARKERS
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer, Tokenizer
from gpt.tokenizer.ranks import (
    ENDOFTEXT,
    GPT2_EOT,
    GPT2_PAT_STR,
    gpt2_ranks,
    gpt2_tokens,
    merge_parts,
)

if TYPE_CHECKING:
    import tokenizers


def hf_tokenizer(tok: Tokenizer) -> tokenizers.Tokenizer:
    """A Hugging Face tokenizer giving the same ids as `tok`."""
    if isinstance(tok, GPT2Tokenizer):
        return _gpt2_to_hf(tok)
    if isinstance(tok, CharTokenizer):
        return _char_to_hf(tok)
    raise TypeError(f"{type(tok).__name__}: no Hugging Face form")


def _gpt2_to_hf(tok: GPT2Tokenizer) -> tokenizers.Tokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    gpt2_ids = range(tok.base_size()) if tok.kept is None else tok.kept
    vocab = {_hf_spelling(g): i for i, g in enumerate(gpt2_ids)}
    # Ordered by the merged token's rank, so merge priorities are GPT-2's.
    merges = [
        (_hf_spelling(a), _hf_spelling(b)) for a, b in filter(None, map(merge_parts, gpt2_ids))
    ]
    # ignore_merges: a piece that is itself a token is taken whole, as tiktoken does.
    hf = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GPT2_PAT_STR), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    # The chat markers take the ids after the vocabulary, as in `tok`.
    specials = [ENDOFTEXT, *(MARKERS if tok.chat else ())]
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return hf


def _char_to_hf(tok: CharTokenizer) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, decoders, models

    # BPE without merges over the whole text: one token per character; Fuse joins them.
    hf = Tokenizer(models.BPE({c: i for i, c in enumerate(tok.chars)}, []))
    hf.decoder = decoders.Fuse()
    return hf


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
    added = [t.get("content") for t in obj.get("added_tokens") or []]
    if decoder == "ByteLevel":
        tok: Tokenizer = GPT2Tokenizer(gpt2_kept(spellings), chat=added[1:] == list(MARKERS))
    elif decoder == "Fuse":
        if any(len(c) != 1 for c in spellings):
            raise ValueError("tokenizer.json: a Fuse-decoded vocabulary must hold characters")
        tok = CharTokenizer("".join(spellings))
    else:
        raise ValueError(f"tokenizer.json: decoder {decoder!r}: expected ByteLevel or Fuse")
    ours = json.loads(hf_tokenizer(tok).to_str())
    for key in ("normalizer", "pre_tokenizer", "model", "decoder"):
        if obj.get(key) != ours[key]:
            raise ValueError(f"tokenizer.json: its {key} is not the one {tok.name} writes")
    if not _adds_nothing(obj.get("post_processor")):
        raise ValueError("tokenizer.json: its post_processor adds tokens; ours adds none")
    if added != [t["content"] for t in ours["added_tokens"]]:
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


def gpt2_kept(spellings: list[str]) -> list[int] | None:
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
