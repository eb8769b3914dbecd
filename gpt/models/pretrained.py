"""A pretrained model's folder (--init_from, fetched by gpt/fetch/model_source.py) as our GPT's
starting weights.

The folder is a transformers GPT-2 or GPT-NeoX directory (`config.json`, safetensors weights,
a tokenizer): GPT-2's own from the Hub, or an earlier run's `model/`. Its config gives the
shape (gpt/models/hf.py maps it: layers, heads, width, context, activation, positions; biases
where its bias tensors hold anything); train-gpt's flags may leave any of it unset, crop the
context (`--block_size` smaller: the learned position table's first rows, as nanoGPT's
`crop_block_size`), and nothing else. Its tokenizer decides which rows of the embedding (which
is also the output head) each of the data's ids starts from: the data must be tokenized for
this model (load-corpus with the same --init_from), and is checked before any weights load.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch

from gpt.config.configs import DEFAULT_SHAPE, GPTConfig, ModelConfig
from gpt.errors import InputError, first_line
from gpt.fetch.model_source import FLAG
from gpt.models import hf
from gpt.models.export import EMBEDDING, HEAD
from gpt.models.model import GPT
from gpt.tokenizer.chat import MARKERS
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer, Tokenizer

POSITIONS = "transformer.wpe.weight"
NEW = -1  # `row_map`'s row for a token the pretrained model lacks (a chat marker)
SHAPE_FLAGS = tuple(DEFAULT_SHAPE)  # what the checkpoint decides; block_size may crop


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model as read: its shape (GPTConfig, its own vocabulary and context), our
    tensors (the embedding unpadded), and the sha256 of its weights file(s)."""

    config: GPTConfig
    weights: dict[str, torch.Tensor]
    weights_sha256: str


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        hf_config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{FLAG}: {path}: no readable model config ({first_line(e)})") from None
    if not isinstance(hf_config, dict):
        raise InputError(f"{FLAG}: {path}: not a JSON object")
    return hf_config


def read(folder: Path) -> Pretrained:
    """Read the model in `folder`; every way it can be unusable is one InputError line."""
    hf_config = read_config(folder)
    arch = (hf_config.get("architectures") or [None])[0]
    if arch is not None and arch not in hf.MODEL_TYPES:
        raise InputError(f"{FLAG}: {folder}: architecture {arch} (model_type "
                         f"{hf_config.get('model_type')!r}) is not one this project builds "
                         f"({' or '.join(hf.MODEL_TYPES)})")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"{FLAG}: {folder}: no *.safetensors weights (a pickled "
                         "pytorch_model.bin is never loaded)")
    tensors = {}
    for f in files:
        try:
            tensors |= safetensors.torch.load_file(str(f), device="cpu")
        except (safetensors.SafetensorError, RuntimeError, OSError) as e:
            raise InputError(f"{FLAG}: {f}: not valid safetensors ({first_line(e)})") from None
    tensors = {k: t.float() for k, t in hf.normalised(tensors).items()}
    try:
        config = hf.gpt_config(hf_config, bias=hf.has_bias(tensors))
        ours = hf.from_hf(config, tensors)
    except ValueError as e:
        raise InputError(f"{FLAG}: {folder}: {e}") from None
    except KeyError as e:
        raise InputError(f"{FLAG}: {folder}: weights lack {e} that its config.json "
                         "implies") from None
    with torch.device("meta"):  # the shapes alone: GPT-2 XL's 1.5 billion parameters unmade
        want = {k: tuple(t.shape) for k, t in GPT(config).state_dict().items() if k != HEAD}
    want[EMBEDDING] = (config.vocab_size, config.n_embd)  # unpadded
    wrong = sorted(k for k in want if tuple(ours[k].shape) != want[k])
    if wrong:
        raise InputError(f"{FLAG}: {folder}: {wrong[0]} is {tuple(ours[wrong[0]].shape)}, its "
                         f"config.json implies {want[wrong[0]]}")
    # One file: its own sha256 (what `sha256sum` and the Hub show); several: of their hashes.
    shas = [_sha256_of(f) for f in files]
    sha = shas[0] if len(shas) == 1 else hashlib.sha256("".join(shas).encode()).hexdigest()
    return Pretrained(config, ours, sha)


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_flags(cfg: ModelConfig, pretrained: GPTConfig) -> None:
    """Refuse a model flag that contradicts the pretrained model: one line naming the flag, its
    value and the checkpoint's. --block_size may be smaller (its positions are cropped)."""
    for name in SHAPE_FLAGS:
        given, theirs = getattr(cfg, name), getattr(pretrained, name)
        if given is not None and given != theirs:
            raise InputError(f"--{name} {_flag(given)}: contradicts {FLAG}, whose {name} is "
                             f"{_flag(theirs)} (leave --{name} unset to take it)")
    if cfg.block_size > pretrained.block_size:
        raise InputError(f"--block_size {cfg.block_size}: larger than {FLAG}'s context, "
                         f"{pretrained.block_size} positions (a smaller one crops them)")
    if cfg.spelling:
        raise InputError(f"--spelling {cfg.spelling}: {FLAG}'s embedding is a plain table; "
                         "leave --spelling unset (or 0)")


def _flag(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def row_map(data: Tokenizer, theirs: Tokenizer, where: str) -> np.ndarray:
    """For each id of the data's tokenizer, the pretrained model's id of the same token: the
    row of its embedding that id starts from (NEW for a chat marker it lacks). InputError (one
    line) when the data was tokenized for another vocabulary."""
    refuse = InputError(f"{where}: the data's tokenizer ({_describe(data)}) is not {FLAG}'s "
                        f"({_describe(theirs)}) nor a compaction of it; run load-corpus with "
                        f"the same {FLAG}")
    if isinstance(data, GPT2Tokenizer) and isinstance(theirs, GPT2Tokenizer):
        if theirs.kept is None:  # GPT-2's whole vocabulary: the data's GPT-2 ids are its rows
            rows = np.arange(data.base_size()) if data.kept is None else np.array(data.kept)
        elif data.kept == theirs.kept:  # an earlier run's compaction, which load-corpus keeps
            rows = np.arange(data.base_size())
        else:
            raise refuse
        if not data.chat:
            return rows
        # The chat markers: the rows of a chat model's own, else new rows (NEW)
        markers = np.arange(theirs.base_size(), theirs.vocab_size) if theirs.chat else (
            np.full(len(MARKERS), NEW))
        return np.concatenate([rows, markers])
    elif isinstance(data, CharTokenizer) and isinstance(theirs, CharTokenizer):
        if data.chars == theirs.chars:
            return np.arange(data.vocab_size)
    raise refuse


def _describe(tok: Tokenizer) -> str:
    if isinstance(tok, GPT2Tokenizer) and tok.kept is not None:
        return f"gpt2 compacted to {tok.vocab_size:,} tokens"
    return f"{tok.name}, {tok.vocab_size:,} tokens"


def initial_weights(pretrained: Pretrained, config: GPTConfig,
                    rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The pretrained tensors for a model of `config` (the data's vocabulary, maybe a shorter
    context): the embedding's rows of the data's ids (`rows`; a NEW one the mean of its rows),
    the first block_size positions.

    Why the mean for a new token (the chat markers GPT-2 lacks): the table is also the output
    head, so a mean row's logit is the mean of the others' logits for any hidden state: the new
    token starts neither likely nor impossible, and the model's distributions over the old
    tokens do not move (Hewitt, "Initializing New Word Embeddings for Pretrained Language
    Models", 2021); a random row of the init's scale would be far from every trained row, whose
    norms are several times larger, and give it an arbitrary logit."""
    weights = dict(pretrained.weights)
    table, new = weights[EMBEDDING], torch.from_numpy(rows == NEW)
    picked = table[torch.from_numpy(np.where(rows == NEW, 0, rows))]
    picked[new] = table.mean(0)
    weights[EMBEDDING] = picked
    if config.position == "learned":
        weights[POSITIONS] = weights[POSITIONS][: config.block_size]
    return weights
