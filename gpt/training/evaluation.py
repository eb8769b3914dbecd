"""train-gpt's evaluation: the mean validation loss over fixed windows of the validation split."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from gpt.config.configs import TrainConfig
from gpt.distributed.world import World
from gpt.models.model import GPT
from gpt.training.batches import IGNORE, TokenData, eval_batches, eval_offsets
from gpt.training.sharding import is_sharded


class Evaluator:
    """The same --eval_iters x --batch_size windows at every evaluation, split over the ranks and
    run `micro_batch` at a time."""

    def __init__(self, data: TokenData, cfg: TrainConfig, world: World, micro_batch: int) -> None:
        self.data, self.world, self.micro_batch = data, world, micro_batch
        self.block_size = cfg.block_size
        self.windows = eval_offsets(len(data.val), cfg.block_size, cfg.eval_iters * cfg.batch_size,
                                    data.row)

    @torch.no_grad()
    def __call__(self, model: GPT,
                 autocast: Callable[[], contextlib.AbstractContextManager]) -> dict[str, float]:
        """`model`'s mean loss (nats per token, and bits per byte) in eval mode, where it stays."""
        model.eval()
        mine = self.windows[self.world.rank :: self.world.size]
        device = self.world.device
        # Summed on the device (in float64, as a Python float would be): one wait at the end,
        # not one per batch.
        total = torch.zeros((), dtype=torch.float64, device=device)
        table = None  # a sharded model's weights are whole only inside its forward
        if not is_sharded(model):
            with autocast():
                table = model.embedding()  # once, not per batch: the weights do not change
        counted = torch.zeros((), dtype=torch.float64, device=device)
        mask = self.data.val_mask
        for x, y in eval_batches(self.data.val, mine, self.block_size, self.micro_batch, device,
                                 mask):
            with autocast():
                loss = model(x, y, embedding=table)[1]
            # Text: every window counts alike; chat data: each target the mask counts does.
            weight = len(x) if mask is None else (y != IGNORE).sum()
            total += loss.double() * weight
            counted += weight
        total, count = self.world.sum([total.item(), counted.item()])
        val = total / count
        return {"val_loss": val, "val_bpb": self.data.meta.bits_per_byte(val)}
