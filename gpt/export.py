"""The exported model: what train-gpt hands to generative-prompt.

`model/` holds `model.safetensors` (weights; never a pickle), `config.json` (the GPTConfig) and
`tokenizer.json` (a copy of `data/tokenizer.json`), written as one directory, atomically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch

from gpt import atomic
from gpt.errors import InputError, first_line
from gpt.model import GPT, GPTConfig

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"


def save_export(model: GPT, tokenizer: dict[str, Any], dest: Path) -> None:
    """Write `dest/` (weights, config, tokenizer) in one atomic step."""
    with atomic.staged_dir(dest) as stage:
        # save_model (not save_file) because the tied embedding/head share one storage; it
        # stores the tensor once and load_model re-ties it.
        safetensors.torch.save_model(model, str(stage / WEIGHTS))
        atomic.write_json(stage / CONFIG, dataclasses.asdict(model.config))
        atomic.write_json(stage / TOKENIZER, tokenizer)


def load_export(src: Path, device: str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """Load `src/` into an eval-mode GPT and the tokenizer's JSON; bad files raise InputError."""
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (src / name).is_file():
            raise InputError(
                f"{src}: no exported model ({name} missing); run `python -m gpt train-gpt` first"
            )
    try:
        config = GPTConfig(**json.loads((src / CONFIG).read_text()))
        tokenizer = json.loads((src / TOKENIZER).read_text())
    except (ValueError, TypeError) as e:
        raise InputError(f"{src}: unreadable model config or tokenizer: {e}") from None
    model = GPT(config)
    try:
        safetensors.torch.load_model(model, str(src / WEIGHTS), strict=True, device=device)
    except (safetensors.SafetensorError, RuntimeError, OSError) as e:
        raise InputError(
            f"{src / WEIGHTS}: not a valid safetensors model ({first_line(e)})"
        ) from None
    return model.to(device).eval(), tokenizer
