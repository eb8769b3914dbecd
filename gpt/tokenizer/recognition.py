"""A pretrained model's tokenizer (--init_from's folder), recognised: one this project's
export wrote, or GPT-2's own, which is the shipped GPT-2 BPE itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpt.errors import InputError
from gpt.tokenizer.huggingface import gpt2_kept, tokenizer_from_hf
from gpt.tokenizer.kinds import GPT2Tokenizer, Tokenizer
from gpt.tokenizer.ranks import GPT2_EOT


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
    if gpt2_kept(sorted(vocab, key=vocab.__getitem__)) is not None or len(vocab) != GPT2_EOT + 1:
        raise ValueError(f"its {len(vocab):,}-token vocabulary is not GPT-2's")
    return GPT2Tokenizer()
