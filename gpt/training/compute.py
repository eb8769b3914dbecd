"""How train-gpt computes on its device: the model its training iteration runs (compiled or not,
wrapped by DDP under torchrun), bfloat16 autocast, a rank's micro-batch; and what the recipe
needs to know of the device (`device_facts`: what unset --compile
and --dtype auto become is gpt/training/recipe.py's)."""

from __future__ import annotations

import contextlib
import os
import shutil

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.config.configs import TrainConfig
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.models.model import GPT
from gpt.training.recipe import Device


def c_compiler() -> str | None:
    """What Triton (torch.compile on CUDA) builds its kernel launchers with, as it looks for one
    (triton/runtime/build.py): $CC, else gcc, else clang; None if there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def device_facts(device: torch.device) -> Device:
    """What the recipe decides from: the device's kind and name, whether it has bfloat16,
    whether Triton can build kernels there."""
    cuda = device.type == "cuda"
    return Device(type=device.type, name=torch.cuda.get_device_name(device) if cuda else "cpu",
                  bf16=not cuda or torch.cuda.is_bf16_supported(),
                  c_compiler=c_compiler() is not None)


def build_training_model(model: GPT, world: World, compiled: bool,
                         sharded: bool = False) -> torch.nn.Module:  # fmt: skip
    """The model the training iteration runs: compiled (--compile), then wrapped by DDP under
    torchrun, unless it is sharded (--shard: gpt/training/sharding.py), which reduces its
    gradients itself."""
    training_model = torch.compile(model) if compiled else model
    if sharded:
        return training_model
    # Every buffer is a constant of the config and the tokenizer (rotary tables, the
    # spelling, the padding mask), equal on every rank from the start: DDP's default would
    # send rank 0's again before each forward, the spelling's 8 MB at GPT-2's vocabulary.
    return DDP(training_model, broadcast_buffers=False) if world.distributed else training_model


def use_bf16(dtype: str) -> bool:
    """Whether the finished --dtype is bfloat16 autocast; float32 also turns TF32 off."""
    if dtype == "float32":
        torch.set_float32_matmul_precision("highest")  # no TF32 either
    return dtype == "bfloat16"


def autocast(bf16: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on `device` where `bf16`, else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def check_fused_loss(fused: bool, device: torch.device) -> None:
    """Refuse --fused_loss where Triton cannot run its kernel: off CUDA (but in Triton's CPU
    interpreter, TRITON_INTERPRET=1, which the tests use), or without Triton."""
    if not fused:
        return
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(f"--fused_loss true: a Triton kernel, for CUDA; this run is on "
                         f"{device.type} (leave --fused_loss false)")
    try:  # here, not first inside the forward that torch.compile traces
        import gpt.models.fused_loss  # noqa: F401  (Triton: CUDA builds of torch ship it)
    except ImportError as e:
        raise InputError(f"--fused_loss true: Triton is not installed here ({e})") from e


def micro_batch_size(cfg: TrainConfig, world: World) -> int:
    """Sequences per rank per micro-batch: --batch_size split over the ranks and their
    micro-batches."""
    if cfg.batch_size % (world.size * cfg.grad_accum):
        raise InputError(
            f"--batch_size {cfg.batch_size}: must split evenly over {world.size} process(es) "
            f"x --grad_accum {cfg.grad_accum} micro-batches"
        )
    return cfg.batch_size // (world.size * cfg.grad_accum)
