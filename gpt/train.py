"""train-gpt: `python -m gpt train` (one process) or `torchrun ... -m gpt -- train` (DDP).

Reads `data/` of the run, trains a GPT, and writes `ckpt/`, `metrics/` and the exported `model/`.
The defaults are nanoGPT's CPU "baby GPT" shape with the recipe of bench/recipe_trials.md
(dropout 0.2, 600 steps; compact GPT-2 tokens from the corpus stage): about a minute on two
cores. The loop itself is in `gpt/trainer.py`; this module is the stage's configuration and
entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpt.config import ModelConfig, RunConfig, check_positive_int, fields_of

# PyTorch is imported when training starts, not here: the pipeline's component image (which has
# none) imports TrainConfig to check a step's flags before it creates a TrainJob.
if TYPE_CHECKING:
    from gpt.model import GPTConfig


@dataclass
class TrainConfig(ModelConfig, RunConfig):
    """train-gpt's flags: the run directory, the model (gpt/config.py's ModelConfig), and these."""

    # batch
    batch_size: int = 12
    """Sequences per optimizer step, over all ranks and micro-steps together: the effective batch,
    the same for any number of processes."""
    grad_accum: int = 1
    """Micro-steps per rank per optimizer step (to fit memory): each rank computes
    batch_size / (world size * grad_accum) sequences at a time."""
    # how long, and how fast
    max_iters: int = 600
    """Stop after this many optimizer steps; the learning rate decays to min_lr over them.
    600 steps of 12 x 64 tokens are ~18 passes over the default corpus: past that it overfits."""
    time_budget: float = 120.0
    """Stop after this many seconds of training, counted over restarts (0 = no limit). With a
    budget the learning rate decays by whichever of steps and time is further along."""
    learning_rate: float = 1e-3
    """Peak learning rate, reached after warmup_iters."""
    min_lr: float = 1e-4
    """Learning rate at the end of the cosine decay."""
    warmup_iters: int = 100
    """Steps of linear learning-rate warmup from 0."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to 2-D weights only (not to biases and LayerNorm gains)."""
    beta2: float = 0.99
    """AdamW beta2; 0.99 suits small batches, 0.95 large ones."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    # reporting and checkpoints
    eval_interval: int = 250
    """Evaluate on val.bin every this many steps (and at the end)."""
    eval_iters: int = 200
    """Batches per evaluation, at most (a small validation split is evaluated whole)."""
    log_interval: int = 10
    """Print progress and append to metrics/train.jsonl every this many steps."""
    ckpt_interval: int = 500
    """Write a checkpoint every this many steps (and at the end)."""
    keep_last: int = 2
    """Keep the newest this many checkpoints."""
    resume: Literal["auto", "never", "require"] = "auto"
    """auto: continue from ckpt/LATEST if there is one; never: start over, removing old
    checkpoints; require: fail unless there is a checkpoint to continue from."""
    seed: int = 1337
    """Seed for initialisation, batches and dropout: equal seeds give equal runs on a CPU."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; auto picks CUDA when available (bf16 autocast and TF32 there)."""
    compile: bool = False
    """torch.compile the model: pays off on a GPU; on a small CPU model compiling costs more
    than it saves."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        ModelConfig.__post_init__(self)
        positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters",
                    "log_interval", "ckpt_interval", "keep_last")
        for name in positive:
            check_positive_int(name, getattr(self, name))
        if self.batch_size % self.grad_accum:
            raise ValueError(f"--batch_size {self.batch_size}: must be divisible by "
                             f"--grad_accum {self.grad_accum}")
        if not 0 <= self.warmup_iters < self.max_iters:
            raise ValueError(
                f"--warmup_iters {self.warmup_iters}: must be in [0, --max_iters {self.max_iters})"
            )
        if not self.time_budget >= 0:
            raise ValueError(f"--time_budget {self.time_budget}: must be >= 0 (0 = no limit)")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning_rate {self.learning_rate}: must be > 0")
        if not 0 <= self.min_lr <= self.learning_rate:
            raise ValueError(f"--min_lr {self.min_lr}: must be in [0, --learning_rate]")
        if not 0 < self.beta2 < 1:
            raise ValueError(f"--beta2 {self.beta2}: must be in (0, 1)")
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name} {getattr(self, name)}: must be >= 0")

    def model_config(self, vocab_size: int) -> GPTConfig:
        from gpt.model import GPTConfig

        return GPTConfig(vocab_size=vocab_size, **fields_of(self, ModelConfig))


def main(cfg: TrainConfig) -> None:
    from gpt import distributed
    from gpt.trainer import Trainer

    world = distributed.setup(cfg.device)
    try:
        Trainer(cfg, world).fit()
    finally:
        distributed.teardown(world)
