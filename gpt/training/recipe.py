"""The recipe: what every flag left unset becomes, decided in one place before the model is
built, and the finished, read-only config the run then trains with (`finish`).

A flag given wins. Left unset, each is decided by the data, the other flags, the device, the
pretrained model of --init_from (its config.json is read before its weights) and, for a resumed
run, its checkpoint's state (gpt/training/checkpoint_files.py's `CheckpointState`):

- what a resumed run must keep, decided once when the run starts and read back from its
  checkpoint after: the model's shape (--n_layer, --n_head, --n_embd, --bias, --position,
  --activation: DEFAULT_SHAPE, or --init_from's), --dropout, --spelling and --ema_decay (a
  rerun with a raised --max_iters, which now passes over the text more often, trains on with
  the dropout and weight average it began with, as an uninterrupted run would have);
- what is decided afresh at every start, resumed or not: --learning_rate, --min_lr and
  --warmup_iters (from scratch's, or the fine-tuning recipe's from the model's width, or
  LoRA's adapters' lora_lr), and from the device --compile, --dtype auto and --chunked_loss;
  --device auto is recorded as the device gpt/distributed/world.py picked (it sets up the
  process group on it).

The finished config is what every part of training reads (the optimizer's schedule, the model,
compute, checkpoints' saved flags, the report's command line), so a run's config is known, and
recorded, before anything is built. No PyTorch here: the device comes in as `Device`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gpt.config.configs import (
    DEFAULT_SHAPE,
    GPTConfig,
    ModelConfig,
    TrainConfig,
    check_rates,
    fields_of,
)
from gpt.errors import InputError

T = TypeVar("T")

# --spelling when unset (for a new run): bytes and byte pairs. On the default corpus it ends
# 0.03 bits per byte lower (mean of three seeds), and the plays reach nanoGPT's quality at
# iteration 75 instead of 120, for ~2-6% more time per iteration; byte triples added nothing
# (bench/recipe_trials.md, issue 22).
DEFAULT_SPELLING = 2

# Dropout when --dropout is unset and the run sees its training tokens more than once.
DROPOUT_REPEATED = 0.2
# Warmup when --warmup_iters is unset, for runs of 120 iterations or more (a quarter of shorter
# ones): 30 iterations reach a given quality sooner than 100 and end within the seeds'
# spread of it (bench/recipe_trials.md, issue 22).
DEFAULT_WARMUP_ITERS = 30
# The weight average when --ema_decay is unset: this decay for a run of at least EMA_MIN_ITERS
# iterations that passes over its training split at least EMA_MIN_PASSES times, else none
# (bench/recipe_trials.md: it helped only there).
DEFAULT_EMA_DECAY = 0.995
EMA_MIN_PASSES = 4
EMA_MIN_ITERS = 600  # three averaging horizons, 3 / (1 - DEFAULT_EMA_DECAY)


# The fine-tuning recipe: what unset flags become with --init_from (docs/stages.md says why).
# A decaying rate: 5e-4 at the default model's width (FINETUNE_LR_WIDTH; a wider model's
# smaller, finetune_lr), cosine to a tenth of it (MIN_LR_FRACTION), with
# no warmup (the weights are not random: no early instability to wait out); dropout by from
# scratch's rule (below). Measured on the default model pretrained on the
# 41 plays, fine-tuned on the comedy (bench/finetune.py, bench/recipe_trials.md): it reaches
# from scratch's final bits per byte at iteration 100 of 600 and ends 0.075 below it; a peak of
# 1e-3 got there at 50 but overfitted (0.015 below), 3e-4 at 125, the constant 1e-4 of before
# at 275; at 1e-3, dropout 0.1 (the recipe before) ended above from scratch, 0.2 below.
FINETUNE_LR = 5e-4
FINETUNE_LR_WIDTH = 128
FINETUNE_WARMUP_ITERS = 0
# The LoRA recipe (--lora_rank): the fine-tuning recipe's schedule at the adapters' own peak,
# lora_lr: LORA_LR at the default model's width, 1 / width smaller for a wider one, as
# finetune_lr. Ten times full fine-tuning's: an adapter starts at zero (its B matrix), so a step
# of it moves the model far less than the same step of every weight, and only the adapters move.
# Measured at 128 (docs/performance.md, "LoRA's learning rate"; rank 8): 2e-4 barely moved the
# model, 5e-3 and 1e-2 did best, 3e-2 diverged. The rule gives 6.3e-4 at GPT-2 medium's 1024
# (the LoRA paper's 2e-4 at its 4x larger alpha / rank) and 1.6e-4 at 4096 (QLoRA's 2e-4 for
# 7B models).
LORA_LR = 5e-3
LEARNING_RATE = 1e-3  # from scratch
MIN_LR = 1e-4
MIN_LR_FRACTION = 0.1  # --init_from: where the decay ends, a fraction of the peak (as from scratch)


def lora_lr(n_embd: int) -> float:
    """--lora_rank's unset peak learning rate for a model `n_embd` wide: LORA_LR at the
    default model's width, scaled as 1 / width as `finetune_lr` is (gpt2 8.3e-4, gpt2-xl
    4e-4)."""
    return LORA_LR * FINETUNE_LR_WIDTH / n_embd


def finetune_lr(n_embd: int) -> float:
    """--init_from's unset peak learning rate for a model `n_embd` wide: FINETUNE_LR at the
    default model's width, scaled as 1 / width (Adam moves every weight by about the rate, so a
    wider layer's output moves more: muP's rule for hidden layers). GPT-2 (768 wide) 8.3e-5,
    gpt2-xl (1600) 4e-5, the range GPT-2 is fine-tuned at (nanoGPT: 3e-5 constant for gpt2-xl);
    measured at 128 only (bench/finetune.py)."""
    return FINETUNE_LR * FINETUNE_LR_WIDTH / n_embd


@dataclass(frozen=True)
class Device:
    """What the recipe reads of the device a run trains on (gpt/training/compute.py's
    `device_facts` reads it off torch)."""

    type: str = "cpu"
    """cpu or cuda."""
    name: str = "cpu"
    """Its name, for a refusal."""
    bf16: bool = True
    """Whether it has bfloat16 (a CPU autocasts to it; a GPU from Ampere on)."""
    c_compiler: bool = True
    """Whether Triton finds a C compiler to build torch.compile's kernel launchers with."""


class Started(Protocol):
    """What a resumed run keeps from its checkpoint's state (a `CheckpointState`)."""

    model: GPTConfig
    ema_decay: float


@dataclass(frozen=True)
class Recipe:
    """A run's finished config and what it says about it."""

    config: TrainConfig
    """The flags with every unset one decided, read-only (`TrainConfig.finished`)."""
    model: GPTConfig
    """The model to build: the shape, the data's vocabulary, dropout and spelling."""
    notes: tuple[str, ...] = ()
    """Lines for the log about a decision the person may want to change."""


def passes(cfg: TrainConfig, train_tokens: int) -> float:
    """How many times the run's tokens (max_iters x batch_size x block_size) cover a training
    split of `train_tokens` tokens: what decides a new run's dropout and average."""
    return cfg.max_iters * cfg.batch_size * cfg.block_size / max(1, train_tokens)


def new_run_dropout(cfg: TrainConfig, train_tokens: int) -> float:
    """Unset --dropout, new run: on only where the run sees its text again."""
    return DROPOUT_REPEATED if passes(cfg, train_tokens) > 1 else 0.0


def new_run_ema_decay(cfg: TrainConfig, train_tokens: int) -> float:
    """Unset --ema_decay, new run: an average only for a long run that passes over its text
    often (bench/recipe_trials.md: it helped only there)."""
    on = passes(cfg, train_tokens) >= EMA_MIN_PASSES and cfg.max_iters >= EMA_MIN_ITERS
    return DEFAULT_EMA_DECAY if on else 0.0


def _chosen(flag: T | None, started_with: T | None, default: T) -> T:
    """The rule: the flag if given; else what the run started with, if it resumes
    (`started_with`, None for a new run); else the new run's `default`."""
    if flag is not None:
        return flag
    return default if started_with is None else started_with


def finish(cfg: TrainConfig, vocab_size: int, train_tokens: int, saved: Started | None = None,
           pretrained: GPTConfig | None = None, device: Device = Device()) -> Recipe:
    """The finished config of a run with flags `cfg` on data of `vocab_size` ids and
    `train_tokens` training tokens, on `device`, resuming the checkpoint state `saved` (None: a
    new run), a new run starting from the model `pretrained` (--init_from's config; None: from
    scratch). InputError where what was decided contradicts what was given."""
    model = _model(cfg, vocab_size, train_tokens, saved, pretrained)
    ema_decay = _chosen(cfg.ema_decay, saved.ema_decay if saved is not None else None,
                        new_run_ema_decay(cfg, train_tokens))
    decided, notes = _on_device(cfg, device)
    finished = dataclasses.replace(
        cfg, **{k: getattr(model, k) for k in (*DEFAULT_SHAPE, "dropout", "spelling")},
        ema_decay=ema_decay, **_schedule(cfg, model.n_embd), **decided)
    return Recipe(finished.finished(), model, notes)


def _model(cfg: TrainConfig, vocab_size: int, train_tokens: int, saved: Started | None,
           pretrained: GPTConfig | None) -> GPTConfig:
    """The model's shape, dropout and spelling: given, kept from the checkpoint, or a new
    run's (from scratch DEFAULT_SHAPE and DEFAULT_SPELLING; fine-tuning the pretrained shape
    and a plain table, whose rows are the pretrained ones)."""
    started = saved.model if saved is not None else None
    if pretrained is not None:  # a new fine-tuning run
        new_spelling, new_shape = 0, vars(pretrained)
    else:
        new_spelling, new_shape = DEFAULT_SPELLING, DEFAULT_SHAPE
    new_dropout = new_run_dropout(cfg, train_tokens)  # fine-tuning a small text overfits too
    dropout = _chosen(cfg.dropout, started.dropout if started else None, new_dropout)
    spelling = _chosen(cfg.spelling, started.spelling if started else None, new_spelling)
    shape = cfg.shape_with(vars(started) if started else new_shape)
    return GPTConfig(**{**fields_of(cfg, ModelConfig), **shape, "dropout": dropout,
                        "spelling": spelling}, vocab_size=vocab_size)  # fmt: skip


def _schedule(cfg: TrainConfig, n_embd: int) -> dict[str, float | int]:
    """The learning rate's peak, end and warmup: from scratch's, or with --init_from the
    fine-tuning recipe's, whose peak follows the model's width `n_embd` (LoRA's adapters: a
    peak of their own, lora_lr)."""
    if cfg.init_from:
        lr = lora_lr(n_embd) if cfg.lora_rank else finetune_lr(n_embd)
        lr = lr if cfg.learning_rate is None else cfg.learning_rate
        min_lr = lr * MIN_LR_FRACTION if cfg.min_lr is None else cfg.min_lr
        warmup = FINETUNE_WARMUP_ITERS
    else:
        lr = LEARNING_RATE if cfg.learning_rate is None else cfg.learning_rate
        min_lr = MIN_LR if cfg.min_lr is None else cfg.min_lr
        warmup = min(DEFAULT_WARMUP_ITERS, cfg.max_iters // 4)
    try:
        check_rates(lr, min_lr)
    except ValueError as e:
        raise InputError(str(e)) from None
    return {"learning_rate": lr, "min_lr": min_lr,
            "warmup_iters": warmup if cfg.warmup_iters is None else cfg.warmup_iters}


def _on_device(cfg: TrainConfig, device: Device) -> tuple[dict[str, object], tuple[str, ...]]:
    """--compile, --dtype auto and --chunked_loss as the device decides them (and --device as
    the device world.py picked):
    compiled on a GPU, where its ~40 s pay off within minutes, if Triton can build there;
    bfloat16 autocast on a GPU that has it; the loss in chunks on a GPU (and always with
    --fused_loss), whose whole logits are an iteration's largest tensors, never on a CPU, whose
    runs keep their bits."""
    cuda = device.type == "cuda"
    notes = []
    compiled = cfg.compile
    if compiled is None:
        compiled = cuda and device.c_compiler
        if cuda and not compiled:
            notes.append("train-gpt: not compiling, as Triton finds no C compiler ($CC, gcc or "
                         "clang) to build kernels with; install one, or pass --compile false")
    if cfg.dtype == "bfloat16" and not device.bf16:
        raise InputError(f"--dtype bfloat16: {device.name} has no bfloat16; use --dtype float32")
    dtype = cfg.dtype if cfg.dtype != "auto" else "bfloat16" if cuda and device.bf16 else "float32"
    chunked = cfg.fused_loss or (cuda if cfg.chunked_loss is None else cfg.chunked_loss)
    return ({"device": device.type, "compile": compiled, "dtype": dtype,
             "chunked_loss": chunked}, tuple(notes))
