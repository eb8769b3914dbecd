"""Telling a diverged run without stalling the GPU.

Reading an iteration's loss on the host (`.item()`) makes the host wait until the device has
finished that iteration, so it cannot queue the next one meanwhile. Here an iteration's verdict
stays on the device: the first non-finite iteration is remembered there, from that iteration on
the optimizer skips its updates
(fused AdamW's `found_inf`, the flag GradScaler sets), and the host reads the verdict only where
it waits for the device anyway: before progress is logged and before anything is written. So a
diverged run stops a few iterations later than the iteration that diverged, but its weights are
those after the last finite iteration, and no metric or checkpoint holds anything after it.
"""

from __future__ import annotations

import torch

from gpt.errors import InputError


class NonFiniteLoss(InputError):
    """Training diverged. Reported like bad input (one line, exit code 2) because the cause is
    almost always a hyper-parameter: the learning rate, or no gradient clipping."""


class Divergence:
    """The first iteration whose loss or gradient norm was not finite, kept on the device."""

    def __init__(self, device: torch.device) -> None:
        self.first_bad = torch.zeros((), dtype=torch.int64, device=device)  # its number; 0: none
        self.values = torch.zeros(2, device=device)  # that iteration's loss and gradient norm

    def record(self, iteration: int, loss: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """Note iteration `iteration`'s mean loss and gradient norm; return the optimizer's
        `found_inf`: 1.0 from the first non-finite iteration on, so no update is applied after
        it."""
        new = ~torch.isfinite(loss + norm) & (self.first_bad == 0)
        self.first_bad = torch.where(new, iteration, self.first_bad)
        self.values = torch.where(new, torch.stack([loss, norm]).float(), self.values)
        return (self.first_bad > 0).float()

    def check(self) -> None:
        """Raise NonFiniteLoss if an iteration diverged (waits for the device)."""
        bad = int(self.first_bad)
        if bad:
            loss, norm = self.values.tolist()
            raise NonFiniteLoss(
                f"step {bad}: loss {loss:.4g}, gradient norm {norm:.4g}; no update was applied "
                f"from that step on, and nothing after step {bad - 1} was saved; lower "
                "--learning_rate or set --grad_clip"
            )
