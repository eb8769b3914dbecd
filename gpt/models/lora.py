"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), through PEFT:
train-gpt's --lora_rank. Beside each projection --lora_targets names (gpt/models/model.py's
attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) PEFT's `inject_adapter_in_model` puts a
low-rank adapter, its output lora_alpha / rank x B(A(x)), B starting at zero (so the model
starts as the pretrained one), and freezes every other weight: only the adapters train.

An adapted projection is PEFT's `lora.Linear` around our `nn.Linear` (its `base_layer`), so the
model's tensors get PEFT's names (`attn.c_attn.base_layer.weight`, `attn.c_attn.lora_A.default.
weight`). Out of it come: the adapters alone (`adapter_weights`: what a checkpoint holds, the
frozen rest being --init_from's), the plain model with each adapter merged into its weight
(`merged_weights`: what model/ exports, for every tool that reads it), and the adapters in
PEFT's own files (`save_adapters`, the run's adapter/), which `peft.PeftModel.from_pretrained`
loads onto transformers' model of the start (GPT-2's or GPT-NeoX's: gpt/models/hf.py maps the
names, and regroups c_attn's B per head for GPT-NeoX).

PEFT is imported by the functions that need it, only for a run with --lora_rank: it imports
transformers (about 2 s), which train-gpt otherwise never loads. Reading names needs neither.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import safetensors.torch
import torch

from gpt.config.configs import LORA_TARGETS, GPTConfig
from gpt.fetch.model_source import parse as parse_init_from
from gpt.models import hf
from gpt.rundir import atomic

ADAPTER = "default"  # PEFT's name of a model's one adapter; its files leave it out
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PEFT's files name a tensor by its place in a PeftModel
_KINDS = (".lora_A.", ".lora_B.")


def add_adapters(model: torch.nn.Module, rank: int, alpha: float,
                 targets: list[str]) -> torch.nn.Module:  # fmt: skip
    """Adapters of `rank` on each of `targets` (their names in every block) of `model`, in
    place, every other parameter frozen; draws the A matrices from torch's generator."""
    from peft import LoraConfig, inject_adapter_in_model

    # No dropout of its own: the model's dropout (the recipe's) still acts on every activation.
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                        bias="none")  # fmt: skip
    return inject_adapter_in_model(config, model, adapter_name=ADAPTER)


def is_adapter(name: str) -> bool:
    """Whether the tensor `name` (of a state_dict) is an adapter's."""
    return any(kind in name for kind in _KINDS)


def has_adapters(module: torch.nn.Module) -> bool:
    """Whether `module` (a model, or its weight average) has LoRA's adapters."""
    return any(is_adapter(name) for name, _ in module.named_parameters())


def adapter_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors of `module` by name; empty for a model without adapters."""
    return {name: t for name, t in module.state_dict().items() if is_adapter(name)}


def load_adapters(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load `tensors` into `module`'s adapters, which they must be exactly: ValueError naming
    the first one missing or foreign."""
    want = adapter_weights(module)
    if wrong := sorted(set(want) ^ set(tensors)):
        raise ValueError(f"{wrong[0]} {'missing' if wrong[0] in want else 'is no adapter here'}")
    if bad := [k for k in want if want[k].shape != tensors[k].shape]:
        raise ValueError(f"{bad[0]} is {tuple(tensors[bad[0]].shape)}, the adapter "
                         f"{tuple(want[bad[0]].shape)}")
    module.load_state_dict(tensors, strict=False)


def _adapted(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state_dict as the plain model's: each adapted projection's weight plus its
    adapter's product (PEFT's own `get_delta_weight`, what its merge adds), under its plain
    name; the adapters' tensors left out."""
    weights = {name.replace(".base_layer.", "."): t for name, t in module.state_dict().items()
               if not is_adapter(name)}  # fmt: skip
    for name, layer in _adapted(module).items():
        weights[f"{name}.weight"] = layer.base_layer.weight + layer.get_delta_weight(ADAPTER)
    return weights


def save_adapters(module: torch.nn.Module, config: GPTConfig, dest: Path, start: str,
                  revision: str | None) -> None:  # fmt: skip
    """Write `dest/` (atomically) as PEFT's adapter folder for transformers' model of the start
    (`start`: --init_from, canonical; `revision`: its Hub commit): adapter_config.json and
    adapter_model.safetensors, which `PeftModel.from_pretrained(model, dest)` loads onto that
    model (its embedding is the start's whole vocabulary: the adapters do not touch it)."""
    ours = module.peft_config[ADAPTER]  # the LoraConfig `add_adapters` gave PEFT
    source = parse_init_from(start)
    theirs = dataclasses.replace(
        ours, task_type="CAUSAL_LM",
        target_modules=hf.lora_targets(config, [t for t in LORA_TARGETS
                                                if t in ours.target_modules]),
        fan_in_fan_out=hf.architecture(config) == "GPT2LMHeadModel",  # Conv1D's (in, out)
        base_model_name_or_path=source.repo if source.kind == "hub" else source.canonical,
        revision=revision)  # fmt: skip
    adapters = {name.replace(f".{ADAPTER}.", "."): t.detach().cpu()
                for name, t in adapter_weights(module).items()}  # fmt: skip
    tensors = {PEFT_PREFIX + name: t for name, t in hf.lora_to_hf(config, adapters).items()}
    with atomic.staged_dir(dest, what="the LoRA adapters") as stage:
        safetensors.torch.save_file(tensors, str(stage / ADAPTER_WEIGHTS),
                                    metadata={"format": "pt"})  # fmt: skip
        theirs.save_pretrained(str(stage))
