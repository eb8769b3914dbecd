"""Sharded training (--shard): the weights, their gradients and AdamW's state split over the
ranks with PyTorch's FSDP2 (`fully_shard`), as torchtitan does it.

Each transformer block is a unit of its own: its whole weights are gathered from every rank just
before its forward (and again before its backward) and freed after, and its gradients are
reduce-scattered, each rank keeping the rows it owns. The root unit holds the rest (the tied
embedding and output head, the last LayerNorm, learned positions, a spelled embedding's n-gram
table), gathered for the whole forward. Outside a forward every parameter is a DTensor, each
rank holding its rows, which the optimizer, the weight average and clipping work on as they are;
what needs the weights whole (the export) gathers them here.

One rank has nothing to shard with: a run of one process trains the plain model, and only its
checkpoints are the sharded kind (gpt/training/sharded_checkpoint.py), so that more ranks can
resume them.
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from gpt.models.model import GPT


def shard(model: GPT) -> None:
    """Shard `model` in place over every rank: each block, then the root, each unit moved to
    this rank's device (a GPU's, where torchrun's rank set one) as it is sharded."""
    # The logits GPT.forward returns are a view (the real vocabulary's columns), which FSDP2
    # warns of on every rank, in case an in-place op on them skipped its backward hook; nothing
    # changes them in place (training reads the loss alone).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are shards (its weights whole only inside its forward)."""
    return isinstance(model, FSDPModule)


def whole(t: torch.Tensor) -> torch.Tensor:
    """`t` as a plain tensor: a DTensor (a sharded model's gradient norm) gathered."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state dict, whole, on rank 0's CPU ({} on the other ranks); every rank must
    call it (the shards are gathered a tensor at a time, so no device holds them all)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
