"""How train-gpt computes on its device: the model its training iteration runs (compiled or not,
wrapped by DDP under torchrun) and bfloat16 autocast. Where --compile is unset, and what
--dtype auto means, is decided here."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.models.model import GPT


def c_compiler() -> str | None:
    """What Triton (torch.compile on CUDA) builds its kernel launchers with, as it looks for one
    (triton/runtime/build.py): $CC, else gcc, else clang; None if there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def build_training_model(model: GPT, world: World, compiled: bool | None,
                     log: Callable[[str], None]) -> torch.nn.Module:
    """The model the training iteration runs: compiled (--compile; unset: on CUDA, if Triton can
    build its kernel launchers there), then wrapped by DDP under torchrun."""
    cuda = world.device.type == "cuda"
    if compiled is None:
        compiled = cuda and c_compiler() is not None
        if cuda and not compiled:
            log("train-gpt: not compiling, as Triton finds no C compiler ($CC, gcc or "
                "clang) to build kernels with; install one, or pass --compile false")
    training_model = torch.compile(model) if compiled else model
    # Every buffer is a constant of the config and the tokenizer (rotary tables, the
    # spelling, the padding mask), equal on every rank from the start: DDP's default would
    # send rank 0's again before each forward, the spelling's 8 MB at GPT-2's vocabulary.
    return DDP(training_model, broadcast_buffers=False) if world.distributed else training_model


def use_bf16(dtype: str, device: torch.device) -> bool:
    """Whether --dtype means bfloat16 autocast on `device` (auto: on CUDA where it has bfloat16);
    --dtype float32 also turns TF32 off."""
    cuda = device.type == "cuda"
    has_bf16 = not cuda or torch.cuda.is_bf16_supported()
    if dtype == "bfloat16" and not has_bf16:
        raise InputError(f"--dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; "
                         "use --dtype float32")
    if dtype == "float32":
        torch.set_float32_matmul_precision("highest")  # asked for: no TF32 either
    return dtype == "bfloat16" or (dtype == "auto" and cuda and has_bf16)


def autocast(bf16: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on `device` where `bf16`, else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
