"""What a training run's model and weight average are: the rule for the flags left unset
that a resumed run must keep, the model's shape (--n_layer, --n_head, --n_embd, --bias,
--position, --activation), --dropout, --spelling and --ema_decay.

A flag given wins. Left unset, each is decided once, when the run starts, by the data, the
other flags and the pretrained model of --init_from (the defaults below: its shape, a plain
embedding), and a resumed run keeps what it started with, read from its
checkpoint's state (gpt/training/checkpoint_files.py's `CheckpointState`): a rerun with a raised
--max_iters, which now passes over the text more often, trains on with the dropout and weight
average it began with, as an uninterrupted run would have. `resolve_unset` applies that rule;
`Trainer` builds what it returns.

The other flags that may be left unset are decided afresh at every start, resumed or not, where
they are used: --learning_rate, --min_lr and --warmup_iters by `TrainConfig`
(gpt/config/configs.py, from --init_from and --max_iters; with --init_from the rates from the
model's width, `TrainConfig.with_width`),
--compile and --dtype auto by gpt/training/compute.py, --chunked_loss by `GPT.forward`
(gpt/models/model.py), --device auto by gpt/distributed/world.py (all four from the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gpt.config.configs import (
    DEFAULT_EMA_DECAY,
    DEFAULT_SHAPE,
    DEFAULT_SPELLING,
    DROPOUT_REPEATED,
    EMA_MIN_ITERS,
    EMA_MIN_PASSES,
    GPTConfig,
    ModelConfig,
    TrainConfig,
    fields_of,
)

if TYPE_CHECKING:  # no PyTorch for the rule itself
    from gpt.training.checkpoint_files import CheckpointState

T = TypeVar("T")


@dataclass(frozen=True)
class Resolved:
    """What a run trains with once its unset --dropout, --spelling and --ema_decay are decided."""

    model: GPTConfig
    """The model to build: the flags' shape, the data's vocabulary, dropout and spelling."""
    ema_decay: float
    """The weight average's decay per iteration; 0: no average."""


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


def resolve_unset(cfg: TrainConfig, vocab_size: int, train_tokens: int,
                  saved: CheckpointState | None = None,
                  pretrained: GPTConfig | None = None) -> Resolved:
    """What a run trains with with flags `cfg` on data of `vocab_size` ids and `train_tokens`
    training tokens, resuming the checkpoint state `saved` (None: a new run), a new run
    starting from the model `pretrained` (--init_from's shape; None: from scratch)."""
    started = saved.model if saved is not None else None
    if pretrained is not None:  # a new fine-tuning run
        new_spelling, new_shape = 0, vars(pretrained)
    else:
        new_spelling, new_shape = DEFAULT_SPELLING, DEFAULT_SHAPE
    new_dropout = new_run_dropout(cfg, train_tokens)  # fine-tuning a small text overfits too
    dropout = _chosen(cfg.dropout, started.dropout if started else None, new_dropout)
    spelling = _chosen(cfg.spelling, started.spelling if started else None, new_spelling)
    ema_decay = _chosen(cfg.ema_decay, saved.ema_decay if saved is not None else None,
                        new_run_ema_decay(cfg, train_tokens))
    shape = cfg.shape_with(vars(started) if started else new_shape)
    model = GPTConfig(**{**fields_of(cfg, ModelConfig), **shape, "dropout": dropout,
                         "spelling": spelling}, vocab_size=vocab_size)  # fmt: skip
    return Resolved(model, ema_decay)
