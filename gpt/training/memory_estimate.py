"""How much memory training takes per device, said before the model moves there, and a run that
cannot fit refused in one line that names the cheapest change that would fit.

The estimate adds what a training iteration holds at its peak, the end of the forward: float32
weights (and autocast's bfloat16 copies of them, kept for backward), gradients and AdamW's two
moments for what is trained, the activations a micro-batch keeps for backward, and the logits
where the loss is not chunked. It is a model of the run, not a measurement: what the runtime
holds whatever the model (the CUDA context, kernels' workspaces, the allocator's slack) is not
in it; bench/memory_peaks.py holds it against peaks measured on a CPU (within 11% there,
where the model's memory is most of the peak) and bench/finetune_memory.py against a GPU's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from gpt.config.configs import LORA_TARGETS, TrainConfig
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.memory import memory_limit, usable_memory
from gpt.models.model import GPT

GiB = 2**30
BUSY_TOKENS = 4096
"""Tokens a micro-batch needs for a GPU's matmuls to stay busy: smaller ones cost time (the
cheapest-fit order's rough rule)."""
ACTIVATION_BYTES = {True: 62, False: 68}
"""Bytes a layer keeps for backward per token and unit of width, in bfloat16 autocast (True) and
float32: 62 is the slope of the peaks measured on an H200 (GPT-2 124M compiled, micro-batches
of 16 and 64 sequences of 1,024: 12.5 and 38.8 GiB; ../shared/gpu-results/2026-11-27-h200),
68 is twice Korthikanti et al.'s 34 bytes of 16-bit values, which the CPU's float32 peaks agree
with (bench/memory_peaks.py)."""
RECOMPUTE = 4 / 3
"""Activation checkpointing's time: each block's forward again in backward, a third more."""
LORA_RANK = 16
"""The adapters' rank a refusal suggests where only LoRA fits: a common choice (the LoRA and
QLoRA papers' 8-64), a fraction of a percent of GPT-2's parameters."""
SHARDING = 1.1
"""Sharding's time, roughly: every block's weights gathered twice an iteration (forward and
backward) where DDP all-reduces the gradients once, mostly hidden behind the compute."""


@dataclass(frozen=True)
class Plan:
    """How a run trains, as far as memory goes: what the flags it can change decide."""

    micro_batch: int
    """Sequences per rank per forward (--batch_size over the ranks and --grad_accum)."""
    grad_accum: int
    """Micro-batches per iteration (--grad_accum)."""
    activation_checkpointing: bool
    """Only each block's input kept for backward (--activation_checkpointing)."""
    shards: int = 1
    """Ranks the weights, gradients and AdamW's state are split over (--shard: FSDP2); 1, each
    rank holds them whole (DDP, or one process)."""
    average: bool = False
    """A weight average is kept (--ema_decay): one more float32 copy of what trains."""
    lora_rank: int = 0
    """Adapters of this rank train, the rest frozen (--lora_rank); 0: every weight trains."""

    @classmethod
    def of(cls, cfg: TrainConfig, micro_batch: int, world: World) -> Plan:
        shards = world.size if cfg.shard and world.distributed else 1
        return cls(micro_batch, cfg.grad_accum, cfg.activation_checkpointing, shards,
                   bool(cfg.ema_decay), cfg.lora_rank)

    def describe(self) -> str:
        how = [f"LoRA rank {self.lora_rank}" if self.lora_rank else "full training",
               f"micro-batch {self.micro_batch}"]
        if self.activation_checkpointing:
            how.append("activation checkpointing")
        if self.shards > 1:
            how.append(f"sharded over {self.shards} ranks")
        return ", ".join(how)

    def flags(self, before: Plan) -> str:
        """The flags that change `before` into this plan."""
        changed = []
        if self.grad_accum != before.grad_accum:
            changed.append(f"--grad_accum {self.grad_accum}")
        if self.activation_checkpointing and not before.activation_checkpointing:
            changed.append("--activation_checkpointing true")
        if self.shards != before.shards:
            changed.append(f"--shard {str(self.shards > before.shards).lower()}")
        if self.lora_rank != before.lora_rank:
            changed.append(f"--lora_rank {self.lora_rank}")
        return " ".join(changed)

    def relative_time(self, block_size: int) -> float:
        """About how long an iteration takes against the same run unsharded, with neither
        checkpointing nor micro-batches too small to keep a GPU busy: to rank the changes that
        would fit."""
        short = max(1.0, BUSY_TOKENS / (self.micro_batch * block_size))
        recompute = RECOMPUTE if self.activation_checkpointing else 1.0
        return short * recompute * (SHARDING if self.shards > 1 else 1.0)


@dataclass(frozen=True)
class Estimate:
    """Bytes per device, by what holds them."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def parts(self) -> str:
        """What holds the memory, in GiB: "weights 0.50, gradients 0.46, ..." (none at 0)."""
        return ", ".join(f"{name} {value / GiB:.2f}" for name, value in (
            ("weights", self.weights), ("gradients", self.gradients),
            ("AdamW", self.optimizer), ("activations", self.activations),
            ("logits", self.logits)) if value) + " GiB"  # fmt: skip

    def describe(self) -> str:
        return f"about {self.total / GiB:.1f} GiB per device ({self.parts()})"


def estimate(model: GPT, plan: Plan, bf16: bool, chunked_loss: bool, cuda: bool) -> Estimate:
    """What training `model` as `plan` says holds at its peak, per device.

    Activations per layer: sequences x context x width x `ACTIVATION_BYTES` (Korthikanti et al.
    2022, "Reducing Activation Recomputation", count 34 bytes in 16 bits; measured, bfloat16
    autocast keeps more, as it leaves the residual stream and the norms in float32), with
    10 x heads x context / width bytes more where attention's (T, T) weights are kept in float32
    (a CPU's attention; CUDA's flash attention keeps none). With
    activation checkpointing only each layer's input (the float32 residual stream) and one
    layer's activations again in backward. The logits, unless the loss is chunked: three float32
    copies of sequences x context x vocabulary (the logits, the log-softmax cross-entropy keeps,
    and in backward the gradient of the logits), as measured on a CPU."""
    c = model.config
    params, trained = _parameters(model, plan.lora_rank)
    tokens = plan.micro_batch * c.block_size
    attention = 0 if cuda else 10 * c.n_head * c.block_size
    block = tokens * (ACTIVATION_BYTES[bf16] * c.n_embd + attention)  # one layer's, for backward
    if plan.activation_checkpointing:
        activations = c.n_layer * 4 * tokens * c.n_embd + block
    else:
        activations = c.n_layer * block
    n = plan.shards
    # Sharded (gpt/training/sharding.py), a rank holds its share of the state, and whole for a
    # while: the root unit (embedding and head, ...) for the whole forward and backward, and
    # two blocks' weights (one computing, the next one's gather overlapping it) and one
    # block's gradients before they are reduce-scattered.
    whole_weights = whole_gradients = 0
    if n > 1:
        one_block = max(sum(p.numel() for p in b.parameters()) for b in model.transformer.h)
        root = params - c.n_layer * one_block
        whole_weights = 4 * (root + 2 * one_block)
        whole_gradients = 4 * (root + one_block)
    # The weight average copies what trains (a LoRA run's adapters; every weight otherwise).
    held = params + (trained if plan.average else 0)
    return Estimate(
        weights=4 * held // n + whole_weights
        + (2 * params if bf16 else 0),  # autocast's copies, kept for backward
        gradients=4 * trained // n + whole_gradients,
        optimizer=8 * trained // n,
        activations=activations,
        logits=0 if chunked_loss else 3 * 4 * tokens * c.vocab_size,
    )


def _parameters(model: GPT, lora_rank: int) -> tuple[int, int]:
    """The parameters `model` holds (the padding rows too: they are held) and those it trains;
    with `lora_rank` but no adapters yet, as it would with adapters of that rank on every
    projection LoRA may target (r x (inputs + outputs) each)."""
    params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if lora_rank and trained == params:  # a plan for adapters the model does not have
        trained = sum(lora_rank * (m.in_features + m.out_features)
                      for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.endswith(LORA_TARGETS))
        params += trained
    return params, trained


def alternatives(plan: Plan, ranks: int) -> Iterator[Plan]:
    """The changes that keep what is trained and how (the same iterations, to float32
    rounding): smaller micro-batches (--grad_accum), checkpointing, sharding over the `ranks`
    (where there are several), and each combination."""
    checkpointing = [plan.activation_checkpointing, True]
    sharding = [plan.shards, ranks] if ranks > 1 else [plan.shards]
    for checkpointed in sorted(set(checkpointing)):
        for shards in sorted(set(sharding)):
            split = 1
            while plan.micro_batch % split == 0:
                changed = dataclasses.replace(
                    plan, micro_batch=plan.micro_batch // split,
                    grad_accum=plan.grad_accum * split, activation_checkpointing=checkpointed,
                    shards=shards)  # fmt: skip
                if changed != plan:
                    yield changed
                split *= 2


def cheapest_fit(model: GPT, plan: Plan, ranks: int, available: int, bf16: bool,
                 chunked_loss: bool, cuda: bool, lora: bool = False) -> tuple[str, Estimate] | None:
    """The flags of the quickest of `alternatives` whose estimate fits `available` bytes, with
    that estimate; where none does and `lora` (a fine-tuning run of the whole model), the
    quickest with adapters of rank `LORA_RANK` (another training, so only then); None where
    nothing fits."""
    def quickest(plans: Iterator[Plan]) -> tuple[str, Estimate] | None:
        fits = [(changed.relative_time(model.config.block_size), changed.flags(plan), need)
                for changed in plans
                if (need := estimate(model, changed, bf16, chunked_loss, cuda)).total <= available]
        return min(fits, key=lambda fit: fit[0])[1:] if fits else None

    fit = quickest(alternatives(plan, ranks))
    if fit is None and lora:
        adapted = dataclasses.replace(plan, lora_rank=LORA_RANK, shards=1)
        fit = quickest(iter([adapted, *alternatives(adapted, 1)]))
    return fit


def available_memory(device: torch.device) -> tuple[int, str]:
    """What training on `device` may still take, in bytes (0: not known), and its name in a
    sentence: a GPU's free memory, or a CPU's container limit (else the machine's RAM)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"{device} has {free / GiB:.1f} GiB free"
    usable = usable_memory()
    limited = memory_limit() == usable
    return usable, (f"the cpu has {usable / GiB:.1f} GiB "
                    f"({'the container' if limited else 'the machine'}'s limit)")


def check_memory(model: GPT, cfg: TrainConfig, world: World, micro_batch: int,
                 say: Callable[[str], None]) -> None:
    """Say the estimate of training `model` as `cfg` says on this rank's device, then refuse a
    run it cannot fit with one line naming the cheapest change that would."""
    available, where = available_memory(world.device)
    plan, bf16 = Plan.of(cfg, micro_batch, world), cfg.dtype == "bfloat16"
    cuda = world.device.type == "cuda"
    need = estimate(model, plan, bf16, cfg.chunked_loss, cuda)
    say(f"memory: {need.describe()} for {plan.describe()}; {where}")
    if not available or need.total <= available:
        return
    lora = bool(cfg.init_from) and not plan.lora_rank
    fit = cheapest_fit(model, plan, world.size, available, bf16, cfg.chunked_loss, cuda, lora)
    tried = ", ".join(["--grad_accum", "--activation_checkpointing"]
                      + (["--shard"] if world.size > 1 else []) + (["--lora_rank"] if lora else []))
    tried = " or ".join(tried.rsplit(", ", 1))
    advice = (f"the cheapest change that fits: {fit[0]} ({fit[1].total / GiB:.1f} GiB)" if fit
              else f"no {tried} fits: take a smaller model or a device with more memory")
    raise InputError(
        f"{model.describe().split(':')[0]} need about {need.total / GiB:.1f} GiB per device "
        f"to train ({plan.describe()}: {need.parts()}) and {where}; {advice}"
    )
