"""Fine-tuning vs training from scratch (issue 46): does starting from a trained model help?

1. **pretrain**: `load-corpus` on the 41 plays (../shared/data/shakespeare_plays.txt, which does
   not hold The Comedy of Errors) and `train-gpt` with the default recipe (GPT-2 BPE compacted,
   4 layers x 4 heads x 128, 600 iterations of 12 x 64 tokens);
2. **from scratch**: the embedded Comedy of Errors, the default recipe;
3. **fine-tuned**: the same comedy, `--init_from` the pretrained run's `model/` (load-corpus
   tokenizing with its vocabulary), the fine-tuning recipe's defaults (learning rate 1e-4,
   constant, no warmup, dropout 0.1), the same iterations and batch as from scratch.

Every stage runs as the command a user runs (`python -m gpt ...`, its own threads). Both comedy
runs evaluate every EVAL_INTERVAL iterations on the same validation bytes (the last 10% of the
same cleaned text), in bits per byte, which compares across vocabularies. Time is the trainer's
own clock (`elapsed_s` in metrics/train.jsonl: training, with its evaluations and checkpoint
writes, the same schedule for both). The goal: the fine-tuned run reaches the from-scratch run's
final validation bits per byte in at most 0.25x the from-scratch run's time, and ends lower.
The time to reach it is that of the first evaluation at or below it: an upper bound, to one
evaluation interval. On a machine other work shares, the clock's ratio moves with the load; the
ratio in iterations (both runs' iterations cost about the same) does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import Result

PLAYS = Path(__file__).resolve().parents[2] / "shared" / "data" / "shakespeare_plays.txt"
EVAL_INTERVAL = 25  # 10 with --quick
GOAL = 0.25


def gpt(*argv: str) -> None:
    """`python -m gpt <argv>` as a process of its own; its output is the benchmark's log."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "gpt", *argv], env=env, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"python -m gpt {' '.join(argv)}: {done.stderr.strip()[-2000:]}")
    print(done.stdout.strip().splitlines()[-1], flush=True)


def curve(root: Path, run: str) -> list[tuple[int, float, float]]:
    """(iteration, elapsed s, validation bits per byte) of every evaluation of a run."""
    lines = (root / run / "metrics" / "train.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["elapsed_s"], r["val_bpb"]) for r in records if "val_bpb" in r]


def reached(points: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    """The first evaluation at or below `target`: (iteration, elapsed s)."""
    return next(((step, t) for step, t, bpb in points if bpb <= target), None)


def run(quick: bool = False, plays: Path = PLAYS) -> Result:
    iters, interval = (100, 10) if quick else (600, EVAL_INTERVAL)
    result = Result("finetune", {"pretrain_corpus": str(plays), "max_iters": iters,
                                 "eval_interval": interval, "goal": GOAL},
                    ["case", "iterations", "train_s", "final_val_bpb", "reaches_scratch_at",
                     "time_ratio", "iteration_ratio"])  # fmt: skip
    if not plays.exists():
        result.settings["skipped"] = f"{plays} absent"
        return result
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        root = Path(tmp)
        common = ["--root", str(root), "--eval_interval", str(interval), "--max_iters",
                  str(iters)]  # fmt: skip
        t0 = time.perf_counter()
        gpt("load-corpus", "--root", str(root), "--run", "plays", "--source", str(plays))
        gpt("train-gpt", "--root", str(root), "--run", "plays", "--max_iters", str(iters))
        _, pretrain_s, pretrain_bpb = curve(root, "plays")[-1]
        gpt("load-corpus", "--root", str(root), "--run", "scratch")
        gpt("train-gpt", "--run", "scratch", *common)
        model = str(root / "plays" / "model")
        gpt("load-corpus", "--root", str(root), "--run", "tuned", "--init_from", model)
        gpt("train-gpt", "--run", "tuned", "--init_from", model, *common)
        scratch, tuned = curve(root, "scratch"), curve(root, "tuned")
        result.settings["wall_s"] = round(time.perf_counter() - t0, 1)
    target, scratch_s = scratch[-1][2], scratch[-1][1]
    hit = reached(tuned, target)
    result.rows = [
        row("pretrain (41 plays; its own validation)", iters, pretrain_s, pretrain_bpb),
        row("comedy from scratch", iters, scratch_s, target, (scratch[-1][0], scratch_s),
            scratch_s, iters),
        row("comedy fine-tuned", iters, tuned[-1][1], tuned[-1][2], hit, scratch_s, iters),
    ]
    result.settings["curves"] = {"scratch": scratch, "tuned": tuned}  # (step, s, bpb) each
    return result


def row(case: str, iters: int, train_s: float, bpb: float | None,
        hit: tuple[int, float] | None = None, scratch_s: float | None = None,
        scratch_iters: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"case": case, "iterations": iters, "train_s": round(train_s, 1),
                           "final_val_bpb": "-" if bpb is None else round(bpb, 3)}  # fmt: skip
    if scratch_s is not None:
        out["reaches_scratch_at"] = f"step {hit[0]}, {hit[1]:.1f} s" if hit else "never"
        out["time_ratio"] = round(hit[1] / scratch_s, 3) if hit else "-"
        # the same in iterations: what the clock says on a machine shared with other work
        out["iteration_ratio"] = round(hit[0] / scratch_iters, 3) if hit else "-"
    return out


if __name__ == "__main__":
    print(run("--quick" in sys.argv).markdown())
