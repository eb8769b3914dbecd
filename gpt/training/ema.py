"""An exponential moving average of the weights: the model train-gpt evaluates and exports.

On a small corpus the weights of the last iterations are noisy (each fits a dozen windows) and
already overfitting; their average over the last few hundred iterations generalises better
(bench/recipe_trials.md: the comedy's validation bits per byte fall by about 0.02). Training
itself is unchanged: the optimizer updates the raw weights, and this keeps a second copy that
follows them.

The decay warms up: after iteration t it is min(decay, 1 - 1/t), so the first 1/(1 - decay)
iterations are averaged uniformly (iteration 1 is a plain copy) and no trace of the random initial
weights stays in the average of a short run. Then it is a plain EMA. A function of the iteration
alone, so a resumed run averages exactly as a straight one.
"""

from __future__ import annotations

import copy

import torch


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay {decay!r}: must be in (0, 1)")
        self.decay = decay
        # A copy of the module (a tied embedding stays tied, buffers come along), so it
        # evaluates, checkpoints and exports as the model itself does. Frozen weights (LoRA's
        # pretrained ones) never change: the copy shares them, and averages the adapters alone.
        frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
        self.model = copy.deepcopy(model, memo=frozen).requires_grad_(False).eval()

    def decay_at(self, iteration: int) -> float:
        """The decay of the update after iteration `iteration` (1 for the first)."""
        return min(self.decay, 1.0 - 1.0 / iteration)

    @torch.no_grad()
    def update(self, model: torch.nn.Module, iteration: int) -> None:
        """Move the average towards `model`'s weights after iteration `iteration`."""
        weight = 1.0 - self.decay_at(iteration)
        for avg, p in zip(self.model.parameters(), model.parameters(), strict=True):
            if p.requires_grad:
                avg.lerp_(p, weight)
