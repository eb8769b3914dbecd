"""The exported model: what train-gpt hands to generative-prompt.

`model/` holds `model.safetensors` (weights; never a pickle), `config.json` (the GPTConfig) and
`tokenizer.json` (a copy of `data/tokenizer.json`), written as one directory, atomically.

The weights are those of the tokenizer's vocabulary: the token embedding, which is also the
output head, has exactly `vocab_size` rows. The padding rows the model trains with (gpt/model.py)
stay out of the export, and loading puts zeros in their place, which nothing reads.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F

from gpt import atomic
from gpt.errors import InputError, first_line
from gpt.model import GPT, GPTConfig

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
EMBEDDING, HEAD = "transformer.wte.weight", "lm_head.weight"  # one tensor (weight tying)


def export_weights(model: GPT) -> dict[str, torch.Tensor]:
    """The tensors `model.safetensors` holds: the tied embedding once, without padding rows."""
    weights = model.state_dict()
    del weights[HEAD]
    weights[EMBEDDING] = weights[EMBEDDING][: model.config.vocab_size]
    return {name: t.detach().contiguous() for name, t in weights.items()}


def save_export(model: GPT, tokenizer: dict[str, Any], dest: Path) -> None:
    """Write `dest/` (weights, config, tokenizer) in one atomic step."""
    what = "the exported model"
    with atomic.staged_dir(dest, what=what) as stage:
        safetensors.torch.save_file(export_weights(model), str(stage / WEIGHTS))
        atomic.write_json(stage / CONFIG, dataclasses.asdict(model.config), what=what)
        atomic.write_json(stage / TOKENIZER, tokenizer, what=what)


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
        weights = safetensors.torch.load_file(str(src / WEIGHTS), device=device)
    except (safetensors.SafetensorError, RuntimeError, OSError) as e:
        raise InputError(
            f"{src / WEIGHTS}: not a valid safetensors model ({first_line(e)})"
        ) from None
    want = {name: tuple(t.shape) for name, t in export_weights(model).items()}
    got = {name: tuple(t.shape) for name, t in weights.items()}
    if got != want:
        wrong = sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))
        raise InputError(
            f"{src / WEIGHTS}: does not fit {src / CONFIG}: {wrong[0]} is "
            f"{got.get(wrong[0], 'missing')}, expected {want.get(wrong[0], 'nothing')} "
            f"({len(wrong)} tensor(s) differ)"
        )
    rows = model.lm_head.weight.size(0)
    padded = F.pad(weights[EMBEDDING], (0, 0, 0, rows - config.vocab_size))  # zero padding rows
    model.load_state_dict({**weights, EMBEDDING: padded, HEAD: padded}, strict=True)
    return model.to(device).eval(), tokenizer
