"""A pretrained model's tokenizer (--init_from's folder), recognised: one this project's
export wrote, or GPT-2's own, which is the shipped GPT-2 BPE itself."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gpt.errors import InputError
from gpt.tokenizer.huggingface import gpt2_kept, tokenizer_from_hf
from gpt.tokenizer.kinds import GPT2Tokenizer, Tokenizer
from gpt.tokenizer.ranks import GPT2_EOT, gpt2_tokens

# What a tokenizer must split as GPT-2 does to be taken for it (`_probe`): every alternative of
# GPT-2's pattern (contractions, letters, numbers, punctuation, whitespace before a word, inside
# a run and at the end), characters outside ASCII and Latin-1, and every GPT-2 token's bytes.
_EDGES = ("I'm sure you'll say they'd've LEFT, it's 1234567 o'clock!!  \t\n\n  ünïcödé "
          "日本語 🙂 x\u00a0y\r\n\r\nend   ")


def pretrained_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a pretrained model's folder (--init_from): one this project's export
    wrote (`tokenizer_from_hf`), or GPT-2's own, which is the shipped GPT-2 BPE itself,
    recognised by how it tokenizes: GPT-2's vocabulary in GPT-2's order, end-of-text included
    wherever the file keeps it (the model's vocab, or `added_tokens` as transformers'
    TikTokenConverter writes it), and text split into GPT-2's ids (`tokenizer.json`); or the
    Hub's GPT-2 `vocab.json` alone. InputError naming the file for anything else."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    try:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            obj = json.loads(text)
            try:
                return tokenizer_from_hf(obj)
            except ValueError as ours:
                if not _byte_level_bpe(obj):
                    raise ValueError(f"{ours}; nor is it GPT-2's") from None
                return _tokenizing_as_gpt2(obj, text)
        path = folder / "vocab.json"
        if path.is_file():
            return _gpt2_vocabulary(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        raise InputError(f"{path}: not a tokenizer this project can use: {e}") from None
    raise InputError(f"{folder}: no tokenizer.json (nor GPT-2's vocab.json)")


def _byte_level_bpe(obj: Any) -> bool:
    model = obj.get("model") if isinstance(obj, dict) else None
    return (isinstance(model, dict) and model.get("type") == "BPE"
            and (obj.get("decoder") or {}).get("type") == "ByteLevel")  # fmt: skip


def _tokenizing_as_gpt2(obj: dict[str, Any], text: str) -> GPT2Tokenizer:
    """GPT-2's BPE, if the `tokenizer.json` `obj` (whose text is `text`) has GPT-2's vocabulary,
    its end-of-text wherever it keeps it, and splits text into GPT-2's ids; else ValueError."""
    from tokenizers import Tokenizer as HFTokenizer

    vocab = dict(obj["model"].get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in obj.get("added_tokens") or []})
    gpt2 = _gpt2_vocabulary(vocab)
    probe = _probe()
    if HFTokenizer.from_str(text).encode(probe).ids != gpt2.encode(probe):
        raise ValueError("it has GPT-2's vocabulary but does not split text into GPT-2's ids")
    return gpt2


def _gpt2_vocabulary(vocab: Any) -> GPT2Tokenizer:
    """GPT-2's BPE, if `vocab` (token spelling -> id) is GPT-2's own, else ValueError."""
    if not isinstance(vocab, dict):
        raise ValueError("no vocab")
    if gpt2_kept(sorted(vocab, key=vocab.__getitem__)) is not None or len(vocab) != GPT2_EOT + 1:
        raise ValueError(f"its {len(vocab):,}-token vocabulary is not GPT-2's")
    return GPT2Tokenizer()


@functools.cache
def _probe() -> str:
    """_EDGES, then each GPT-2 token (end-of-text's spelling aside, which is text here) after a
    space: a tokenizer that merges any pair differently splits some of them otherwise."""
    tokens = gpt2_tokens()[:GPT2_EOT]
    return _EDGES + b" ".join(tokens).decode("utf-8", errors="replace")
