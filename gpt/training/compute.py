"""How train-gpt computes on its device: the model its training iteration runs (compiled or not,
wrapped by DDP under torchrun), bfloat16 autocast, and whether training fits the device's
memory; and what the recipe needs to know of the device (`device_facts`: what unset --compile
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


def build_training_model(model: GPT, world: World, compiled: bool) -> torch.nn.Module:
    """The model the training iteration runs: compiled (--compile), then wrapped by DDP under
    torchrun."""
    training_model = torch.compile(model) if compiled else model
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


def device_memory(device: torch.device) -> int:
    """The memory training on `device` may use: a GPU's, or the machine's RAM for a CPU (0
    where it is not known)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def training_bytes(model: GPT, micro_batch: int, bf16: bool, chunked_loss: bool, cuda: bool,
                   activation_checkpointing: bool = False) -> int:  # fmt: skip
    """About the memory training `model` takes: float32 weights, gradients and AdamW's two
    moments, 16 bytes a parameter; and what a micro-batch of `micro_batch` sequences keeps for
    backward: per layer about 34 x sequences x context x width values (Korthikanti et al. 2022,
    "Reducing Activation Recomputation", at 2 bytes each; twice that in float32, with
    5 x heads x context / width more where attention's weights are kept: a CPU's), with
    activation checkpointing only each layer's input (the float32 residual stream) and one
    layer's activations again in backward; and the logits (two float32 copies of sequences x
    context x vocabulary) unless the loss is chunked. An estimate to refuse a hopeless run early
    with, not a plan: it errs low."""
    c = model.config
    tokens = micro_batch * c.block_size
    attention = 0 if cuda else 5 * c.n_head * c.block_size
    per_value = 1 if bf16 else 2
    block = tokens * (34 * c.n_embd + attention) * per_value  # one layer's, kept for backward
    if activation_checkpointing:
        activations = c.n_layer * 4 * tokens * c.n_embd + block
    else:
        activations = c.n_layer * block
    logits = 0 if chunked_loss else 2 * 4 * tokens * c.vocab_size
    return 16 * model.num_params() + activations + logits


def micro_batch_size(cfg: TrainConfig, world: World) -> int:
    """Sequences per rank per micro-batch: --batch_size split over the ranks and their
    micro-batches."""
    if cfg.batch_size % (world.size * cfg.grad_accum):
        raise InputError(
            f"--batch_size {cfg.batch_size}: must split evenly over {world.size} process(es) "
            f"x --grad_accum {cfg.grad_accum} micro-batches"
        )
    return cfg.batch_size // (world.size * cfg.grad_accum)


def check_memory(model: GPT, cfg: TrainConfig, world: World, micro_batch: int) -> None:
    """Refuse, before training, a model whose training state cannot fit the device: float32
    weights, gradients and AdamW's two moments (16 bytes a parameter) plus the activations a
    micro-batch keeps for backward (estimated by `training_bytes`)."""
    total = device_memory(world.device)
    cuda = world.device.type == "cuda"
    need = training_bytes(model, micro_batch, cfg.dtype == "bfloat16", cfg.chunked_loss, cuda,
                          cfg.activation_checkpointing)
    if total and need > total:
        raise InputError(
            f"{model.describe().split(':')[0]} need about {need / 2**30:.1f} GiB to train "
            f"(weights, gradients, AdamW: {16 * model.num_params() / 2**30:.1f} GiB; the rest "
            f"activations) and {world.device.type} has {total / 2**30:.1f} GiB; lower "
            "--batch_size (raise --grad_accum) or --block_size"
            f"{'' if cfg.activation_checkpointing else ', turn on --activation_checkpointing'}"
            ", or take a smaller model"
        )
