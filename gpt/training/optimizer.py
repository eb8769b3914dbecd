"""train-gpt's optimizer and its learning-rate schedule."""

from __future__ import annotations

import math

import torch

from gpt.config.configs import TrainConfig
from gpt.models.model import GPT


def lr_at(cfg: TrainConfig, iteration: int) -> float:
    """Linear warmup, then cosine decay to min_lr at max_iters.

    A function of the iteration alone: the wall clock never reaches the arithmetic, so equal seeds
    give equal weights and a resumed run continues exactly where it stopped. A --time_budget
    only picks the iteration to stop at.
    """
    if iteration < cfg.warmup_iters:
        return cfg.learning_rate * (iteration + 1) / (cfg.warmup_iters + 1)
    progress = (iteration - cfg.warmup_iters) / (cfg.max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def build_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on the 2-D weights (matmuls, embeddings) only, not on biases and
    LayerNorm gains, which set scales rather than store features."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel is one launch for all parameters on CUDA, and faster on CPU as well; it
    # is also what skips the updates after a non-finite iteration (`found_inf`,
    # gpt/training/divergence.py).
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, cfg.beta2), fused=True)
