"""Training throughput: tokens/s of the default model on the default corpus, in one process.

Each case builds the real `Trainer` with the defaults of `python -m gpt train-gpt` on the data
of `python -m gpt load-corpus` (also all defaults), and times its optimizer step: the exact step
`fit()` runs, forward, backward, clipping and AdamW, without the evaluations and checkpoints
between. The first step is timed apart (with `torch.compile` it holds the compilation); the
throughput is the median over windows of steps after a warm-up. On CUDA the Trainer trains in
bf16, so the cases there are bf16 (with MFU), fp32 for comparison, and bf16 compiled.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from bench.harness import Result, Stats, default_corpus, fmt_stats, repeat, threads, timed
from gpt.config.configs import TrainConfig
from gpt.distributed import world as distributed
from gpt.training.trainer import Trainer


@dataclass(frozen=True)
class Case:
    label: str
    compile: bool = False
    threads: int | None = None
    """CPU threads (None: what `python -m gpt train-gpt` picks, one per core)."""
    bf16: bool = True
    """On CUDA: the Trainer's bf16 autocast; False measures fp32 (TF32 matmuls) instead."""


def cases(cuda: bool, quick: bool) -> list[Case]:
    if cuda:
        found = [Case("eager bf16"), Case("eager fp32", bf16=False), Case("compile bf16", True)]
    else:
        # One thread against all of them, to back the default thread count.
        found = [Case("eager"), Case("eager, 1 thread", threads=1), Case("compile", True)]
    # Compiling takes tens of seconds on a small CPU: too long for a quick run.
    return [c for c in found if not (quick and (c.compile or c.threads))]


def measure(cfg: TrainConfig, case: Case, warmup: int, windows: int, steps: int) -> dict:
    world = distributed.setup(cfg.device)  # sizes the thread pool as `python -m gpt train-gpt` does
    try:
        with threads(case.threads) as used:
            trainer = Trainer(replace(cfg, compile=case.compile), world)
            trainer.bf16 = trainer.bf16 and case.bf16

            def step() -> None:
                # _train_iteration ends on a .item() of the loss: on CUDA the clock waits for the
                # GPU.
                trainer._train_iteration(trainer.cfg.learning_rate)
                trainer.state.step += 1  # the next iteration draws the next batch, as in fit()

            first_s = timed(step)

            def window() -> float:
                seconds = timed(lambda: [step() for _ in range(steps)])
                return steps * trainer.tokens_per_iter / seconds

            rate = repeat(window, warmup=warmup, repeats=windows)
    finally:
        distributed.teardown(world)
    row = {
        "case": case.label,
        "threads": used if world.device.type == "cpu" else "",
        "tokens/s": fmt_stats(rate),
        "ms/step": f"{trainer.tokens_per_iter / rate.median * 1e3:.1f}",
        "first step": f"{first_s:.2f} s",
        "tokens_per_s": rate.as_dict(),
        "first_step_s": first_s,
    }
    if trainer.bf16 and trainer.peak_flops:
        mfu = Stats([trainer.model.flops_per_token() * r / trainer.peak_flops for r in rate.values])
        row |= {"MFU": f"{mfu.median:.1%}", "mfu": mfu.as_dict()}
    return row


def run(quick: bool) -> Result:
    cuda = torch.cuda.is_available()
    warmup, windows = (1, 3) if quick else (2, 5)
    steps = 50 if cuda else 10  # steps per window: a CUDA step is a few milliseconds
    with tempfile.TemporaryDirectory() as root, _fresh_compile_cache(root):
        rundir = default_corpus(root)
        cfg = TrainConfig(root=root, run=rundir.run_id, resume="never")
        result = Result(
            "train",
            {
                "model": {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd")},
                "block_size": cfg.block_size,
                "batch_size": cfg.batch_size,
                "corpus": "default (embedded), gpt2 tokenizer compacted",
                "device": "cuda" if cuda else "cpu",
                "warmup_windows": warmup,
                "windows": windows,
                "steps_per_window": steps,
            },
            ["case", "threads", "tokens/s", "ms/step", "first step", *(["MFU"] if cuda else [])],
        )
        for case in cases(cuda, quick):
            print(f"bench: train {case.label} ...", flush=True)
            result.rows.append(measure(cfg, case, warmup, windows, steps))
    return result


@contextlib.contextmanager
def _fresh_compile_cache(root: str) -> Iterator[None]:
    """Point Inductor's on-disk cache at an empty folder, so the first compiled step shows the
    compile time of a first run rather than a warm cache left by an earlier one."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
