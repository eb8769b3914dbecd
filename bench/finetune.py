"""Fine-tuning vs training from scratch (issue 46): does starting from a trained model help?

1. **pretrain**: `load-corpus` on the 41 plays (../shared/data/shakespeare_plays.txt, which does
   not hold The Comedy of Errors) and `train-gpt` with the default recipe (GPT-2 BPE compacted,
   4 layers x 4 heads x 128, 12 x 64 tokens an iteration) for PRETRAIN_ITERS iterations,
   evaluated once, at the end. Its time is not part of the comparison, so it is kept between
   runs: the pretrained run lies in bench/.cache/finetune/<the plays' sha256, iterations>/
   (ignored by git; delete it to pretrain again, e.g. after a change to the model's code);
2. **from scratch**: the embedded Comedy of Errors, the default recipe;
3. **fine-tuned**: the same comedy, `--init_from` the pretrained run's `model/` (load-corpus
   tokenizing with its vocabulary), the fine-tuning recipe's defaults (gpt/config/configs.py),
   the same iterations and batch as from scratch.

Every stage runs as the command a user runs (`python -m gpt ...`, with the threads the
environment gives it: OMP_NUM_THREADS=1 on a machine other work shares, where two threads wait
on each other). Both comedy runs evaluate every EVAL_INTERVAL iterations on the same validation
bytes (the last 10% of the same cleaned text), in bits per byte, which compares across
vocabularies. Time is the trainer's own clock (`elapsed_s` in metrics/train.jsonl: training,
with its evaluations and checkpoint writes, the same schedule for both). The goal: the
fine-tuned run reaches the from-scratch run's final validation bits per byte in at most 0.25x
the from-scratch run's time, and ends lower. The time to reach it is that of the first
evaluation at or below it: an upper bound, to one evaluation interval. On a machine other work
shares, the clock's ratio moves with the load; the ratio in iterations does not (a fine-tuned
iteration costs a little more: its vocabulary is the plays', not the comedy's alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import SHARED, Result

PLAYS = SHARED / "data" / "shakespeare_plays.txt"  # ../shared, or where GPT_SHARED says
CACHE = Path(__file__).resolve().parent / ".cache" / "finetune"
PRETRAIN_ITERS = 3000  # about 1.6 passes over the plays (600: a third of one, 2.245 bits/byte)
ITERS, EVAL_INTERVAL = 600, 25
QUICK_PRETRAIN_ITERS, QUICK_ITERS, QUICK_EVAL_INTERVAL = 300, 100, 10
GOAL = 0.25

Curve = list[tuple[int, float, float]]  # (iteration, elapsed s, validation bits per byte)


def gpt(*argv: str) -> None:
    """`python -m gpt <argv>` as a process of its own; its output is the benchmark's log."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "gpt", *argv], env=env, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"python -m gpt {' '.join(argv)}: {done.stderr.strip()[-2000:]}")
    print(done.stdout.strip().splitlines()[-1], flush=True)


def curve(root: Path, run: str) -> Curve:
    """(iteration, elapsed s, validation bits per byte) of every evaluation of a run."""
    lines = (root / run / "metrics" / "train.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["elapsed_s"], r["val_bpb"]) for r in records if "val_bpb" in r]


def reached(points: Curve, target: float) -> tuple[int, float] | None:
    """The first evaluation at or below `target`: (iteration, elapsed s)."""
    return next(((step, t) for step, t, bpb in points if bpb <= target), None)


def pretrained(plays: Path, iters: int) -> tuple[Path, bool]:
    """The root holding run "plays", pretrained for `iters` iterations on `plays`, and whether
    an earlier benchmark had already made it. Made in a sibling folder and renamed into place
    whole, so a run stopped halfway leaves nothing that looks done."""
    key = hashlib.sha256(plays.read_bytes()).hexdigest()[:12]
    root = CACHE / f"plays-{key}-{iters}it"
    if (root / "plays" / "model").is_dir():
        return root, True
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=CACHE))
    try:
        gpt("load-corpus", "--root", str(partial), "--run", "plays", "--source", str(plays))
        gpt("train-gpt", "--root", str(partial), "--run", "plays", "--max_iters", str(iters),
            "--eval_interval", str(iters))  # fmt: skip
        partial.rename(root)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return root, False


def run(quick: bool = False, plays: Path = PLAYS) -> Result:
    pretrain_iters, iters, interval = (
        (QUICK_PRETRAIN_ITERS, QUICK_ITERS, QUICK_EVAL_INTERVAL) if quick
        else (PRETRAIN_ITERS, ITERS, EVAL_INTERVAL)
    )  # fmt: skip
    result = Result("finetune", {"pretrain_corpus": str(plays), "pretrain_iters": pretrain_iters,
                                 "max_iters": iters, "eval_interval": interval, "goal": GOAL,
                                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                    ["case", "iterations", "train_s", "final_val_bpb", "reaches_scratch_at",
                     "time_ratio", "iteration_ratio"])  # fmt: skip
    if not plays.exists():
        result.settings["skipped"] = f"{plays} absent"
        return result
    t0 = time.perf_counter()
    base, cached = pretrained(plays, pretrain_iters)
    result.settings |= {"pretrained": str(base), "pretrained_cached": cached}
    pretrain = curve(base, "plays")[-1]
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        root = Path(tmp)
        common = ["--root", str(root), "--eval_interval", str(interval), "--max_iters",
                  str(iters)]  # fmt: skip
        gpt("load-corpus", "--root", str(root), "--run", "scratch")
        gpt("train-gpt", "--run", "scratch", *common)
        model = str(base / "plays" / "model")
        gpt("load-corpus", "--root", str(root), "--run", "tuned", "--init_from", model)
        gpt("train-gpt", "--run", "tuned", "--init_from", model, *common)
        scratch, tuned = curve(root, "scratch"), curve(root, "tuned")
    result.settings["wall_s"] = round(time.perf_counter() - t0, 1)
    result.rows = [
        row("pretrain (41 plays; its own validation)", pretrain[0], pretrain[1], pretrain[2]),
        row("comedy from scratch", *compared(scratch, scratch)),
        row("comedy fine-tuned", *compared(tuned, scratch)),
    ]
    result.settings["goal_met"] = met(tuned, scratch)
    result.settings["curves"] = {"scratch": scratch, "tuned": tuned}  # (step, s, bpb) each
    return result


def compared(run: Curve, scratch: Curve) -> tuple[int, float, float, dict[str, Any]]:
    """A comedy run's iterations, time and final value, and when it first reached the
    from-scratch run's final value, as a fraction of the from-scratch run's time and
    iterations."""
    step, elapsed, bpb = run[-1]
    hit = reached(run, scratch[-1][2])
    if hit is None:
        return step, elapsed, bpb, {"reaches_scratch_at": "never", "time_ratio": "-",
                                    "iteration_ratio": "-"}  # fmt: skip
    return step, elapsed, bpb, {
        "reaches_scratch_at": f"step {hit[0]}, {hit[1]:.1f} s",
        "time_ratio": round(hit[1] / scratch[-1][1], 3),
        # the same in iterations: what the clock says on a machine shared with other work
        "iteration_ratio": round(hit[0] / scratch[-1][0], 3),
    }


def row(case: str, iters: int, train_s: float, bpb: float,
        reach: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"case": case, "iterations": iters, "train_s": round(train_s, 1),
            "final_val_bpb": round(bpb, 3), **(reach or {})}  # fmt: skip


def met(tuned: Curve, scratch: Curve) -> bool:
    """The goal: the fine-tuned run reaches from scratch's final value in at most GOAL of its
    time, and ends lower."""
    hit = reached(tuned, scratch[-1][2])
    return hit is not None and hit[1] <= GOAL * scratch[-1][1] and tuned[-1][2] < scratch[-1][2]


if __name__ == "__main__":
    print(run("--quick" in sys.argv).markdown())
