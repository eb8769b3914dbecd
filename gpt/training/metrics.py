"""The progress train-gpt logs every --log_interval iterations and writes to metrics/train.jsonl:
loss, learning rate, tokens per second, MFU, the time left."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from gpt.config.configs import TrainConfig
from gpt.distributed.world import World
from gpt.training.checkpoint_files import TrainState

# Dense bf16 peak FLOP/s, for MFU. A GPU not listed shows no MFU rather than a wrong one.
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}


def peak_flops(world: World, bf16: bool) -> float | None:
    """All ranks' peak FLOP/s together, for MFU: None off CUDA, without bf16 autocast, or on a
    GPU that PEAK_FLOPS does not list."""
    cuda = world.device.type == "cuda"
    peaks = [v for k, v in PEAK_FLOPS.items() if cuda and k in torch.cuda.get_device_name()]
    return world.size * peaks[0] if peaks and bf16 else None


def fraction_done(cfg: TrainConfig, st: TrainState) -> float:
    """How much of the run is done: of --max_iters, or of --time_budget where that is further."""
    done = st.step / cfg.max_iters
    if cfg.time_budget:
        done = max(done, st.elapsed_s / cfg.time_budget)
    return min(1.0, done)


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class TrainingProgress:
    """An iteration's progress line and metrics record. Throughput counts training alone: its clock
    restarts (`restart`) when training starts and after an evaluation or a checkpoint."""

    def __init__(self, cfg: TrainConfig, tokens_per_iter: int, flops_per_token: float,
                 peak_flops: float | None, log: Callable[[str], None]) -> None:
        self.cfg, self.tokens_per_iter, self.log = cfg, tokens_per_iter, log
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self._mark = (time.perf_counter(), 0)
        self._per_iter: float | None = None
        """Seconds per iteration over the last logged span; None before the first."""

    def restart(self, iteration: int) -> None:
        self._mark = (time.perf_counter(), iteration)

    def record(self, st: TrainState, loss: float, lr: float) -> dict[str, Any]:
        """Log the progress line of iteration `st.step`, whose mean loss over the ranks is `loss`;
        return its record for train.jsonl."""
        cfg = self.cfg
        now = time.perf_counter()
        since, since_iter = self._mark
        self._mark = (now, st.step)
        self._per_iter = (now - since) / max(1, st.step - since_iter)
        tokens_per_s = self.tokens_per_iter / self._per_iter
        eta = self.remaining_s(st)
        mfu = ""
        record = {"loss": loss, "lr": lr, "tokens_per_s": tokens_per_s}
        if self.peak_flops:
            record["mfu"] = self.flops_per_token * tokens_per_s / self.peak_flops
            mfu = f" | MFU {record['mfu']:.1%}"
        self.log(
            f"step {st.step:>5}/{cfg.max_iters} | loss {loss:.4f} | lr {lr:.2e} | "
            f"{tokens_per_s:,.0f} tok/s{mfu} | {duration(st.elapsed_s)} elapsed, "
            f"ETA {duration(eta)}"
        )
        return record

    def remaining_s(self, st: TrainState) -> float | None:
        """Seconds left at the last logged pace: to --max_iters, or to --time_budget where that
        comes first; None before the first progress line."""
        if self._per_iter is None:
            return None
        eta = (self.cfg.max_iters - st.step) * self._per_iter
        if self.cfg.time_budget:
            eta = min(eta, self.cfg.time_budget - st.elapsed_s)
        return max(0.0, eta)
