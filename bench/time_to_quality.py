"""Time to quality: how good the model gets per second of training, reference vs default recipe.

Each case runs this project's own stages as processes (`python -m gpt load-corpus`, then
`python -m gpt train-gpt`), so threads and memory are the trainer's own, as a user gets them:

- **reference**: nanoGPT's CPU "baby GPT" (char, 4 layers x 4 heads x 128, block 64, batch 12,
  lr 1e-3 -> 1e-4, warmup 100, 2000 iterations, dropout 0) and nanoGPT's model (learned
  positions, GELU), every flag passed explicitly;
- **default**: `python -m gpt load-corpus` and `python -m gpt train-gpt` with their default flags.

Both hold out the last 10% of the text as validation. The trainer writes a checkpoint every
1/CHECKPOINTS of its steps; after training, this process evaluates each checkpoint on the
validation split and pairs its bits per byte with the training time the checkpoint recorded.
So evaluation costs the recipes nothing (as if it ran elsewhere), while the checkpoint writes are
counted: the time is the trainer's own clock, the one `--time_budget` reads (from the first step
to the last, without process start and data loading).

Reported per case: the best validation bits per byte, the training time, and the training time
of the first checkpoint at or below the target (an upper bound, to one checkpoint interval).

`python -m bench.time_to_quality --source plays --tokenizer gpt2 -- --n_layer 6 ...` runs one
case with extra flags (corpus-stage flags such as --max_vocab go to the corpus stage, the rest to
training) and prints its row: how each trial in bench/recipe_trials.md was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from bench.harness import SHARED, Result
from gpt import checkpoint
from gpt.config import CorpusConfig, GPTConfig, TrainConfig
from gpt.data import eval_batches, eval_offsets
from gpt.model import GPT
from gpt.rundir import DataMeta, RunDir
from gpt.stages import to_args

REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "comedy": "default",  # the embedded Comedy of Errors, what `make demo` trains on
    "plays": str(SHARED / "data" / "shakespeare_plays.txt"),
}
# Issue 8's goals: this bits per byte on the default corpus within the default budget; on the
# plays, the reference's final quality, in at most half the reference's time.
TARGET_BPB = {"comedy": 2.02, "plays": 2.708}
REFERENCE = {
    "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
    "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "max_iters": 2000,
    "time_budget": 0, "dropout": 0.0, "weight_decay": 0.1, "beta2": 0.99, "bias": False,
    "position": "learned", "activation": "gelu",
}
CHECKPOINTS = 20  # evaluation points per run
# Validation text per evaluation, at most: what the reference's 200 batches of 12 x 64
# characters cover, so every tokenizer is scored on about the same text.
EVAL_BYTES = 200 * 12 * 64
# Threads per training process: OMP_NUM_THREADS if set, else one per core.
THREADS = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
COLUMNS = ["corpus", "tokenizer", "recipe", "steps", "train s", "best bpb", "target bpb",
           "s to target"]


@dataclass
class Case:
    source: str  # a key of SOURCES
    tokenizer: str  # gpt2 or char
    recipe: str  # "reference" or "default"
    train_flags: dict[str, Any] = field(default_factory=dict)  # on top of the recipe's
    corpus_flags: dict[str, Any] = field(default_factory=dict)  # on top of the corpus defaults

    def flags(self) -> dict[str, Any]:
        return {**(REFERENCE if self.recipe == "reference" else {}), **self.train_flags}

    @classmethod
    def parse(cls, source: str, tokenizer: str, recipe: str, args: list[str]) -> Case:
        """A case from `--flag value` pairs: the corpus stage's own flags go to it, the rest to
        training (block_size, which both have, to training: the corpus stage only checks it)."""
        pairs = dict(zip((k.lstrip("-") for k in args[::2]), args[1::2], strict=True))
        corpus_only = CorpusConfig.__dataclass_fields__.keys() - TrainConfig.__dataclass_fields__
        corpus = {k: v for k, v in pairs.items() if k in corpus_only}
        train = {k: v for k, v in pairs.items() if k not in corpus_only}
        return cls(source, tokenizer, recipe, train, corpus)


def _gpt(args: list[str], log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    with log.open("a") as out:
        out.write(f"$ python -m gpt {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run([sys.executable, "-m", "gpt", *args], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode:
        raise RuntimeError(f"python -m gpt {' '.join(args)} failed:\n{log.read_text()[-2000:]}")


@torch.no_grad()
def evaluate(ckpt: Path, data: Path, meta: DataMeta) -> float:
    """Validation bits per byte of one checkpoint, on evenly spread windows of val.bin."""
    state = json.loads((ckpt / "state.json").read_text())
    model = GPT(GPTConfig(**state["model"]))
    safetensors.torch.load_model(model, str(checkpoint.evaluated_weights(ckpt)))
    model.eval()
    tokens = np.memmap(data / "val.bin", dtype=meta.dtype, mode="r")
    block = model.config.block_size
    bytes_per_window = block * meta.val_bytes / meta.val_tokens
    offsets = eval_offsets(len(tokens), block, max(1, round(EVAL_BYTES / bytes_per_window)))
    total = 0.0
    for x, y in eval_batches(tokens, offsets, block, 64, torch.device("cpu")):
        total += model(x, y)[1].item() * len(x)
    return meta.bits_per_byte(total / len(offsets))


def run_case(case: Case, root: Path, name: str) -> dict[str, Any]:
    """Train one case in `root/name` (its data shared per corpus and tokenizer); its row."""
    log = root / f"{name}.log"
    corpus_flags = {"source": SOURCES[case.source], "tokenizer": case.tokenizer,
                    "block_size": 64, **case.corpus_flags}
    data_run = "-".join(["data", case.source, case.tokenizer,
                         *(f"{k}{v}" for k, v in sorted(case.corpus_flags.items()))])
    if not (root / data_run / "data").is_dir():
        _gpt(["load-corpus", "--root", str(root), "--run", data_run, *to_args(corpus_flags)], log)
    (root / name).mkdir()
    for part in ("corpus", "data"):
        (root / name / part).symlink_to(root / data_run / part)
    flags = case.flags()
    max_iters = int(flags.get("max_iters", TrainConfig.max_iters))
    # When to checkpoint and evaluate: nothing that changes the training.
    bench_flags = {"ckpt_interval": max(1, max_iters // CHECKPOINTS), "eval_interval": max_iters,
                   "keep_last": 10**6, "resume": "never"}
    _gpt(["train-gpt", "--root", str(root), "--run", name, *to_args({**bench_flags, **flags})], log)

    data = root / name / "data"
    meta = DataMeta.read(RunDir.of(root, name).meta_json)
    curve = []
    for ckpt in sorted((root / name / "ckpt").glob("step-*"), key=lambda p: int(p.name[5:])):
        train = json.loads((ckpt / "state.json").read_text())["train"]
        curve.append({"step": train["step"], "train_s": round(train["elapsed_s"], 2),
                      "val_bpb": round(evaluate(ckpt, data, meta), 4)})
    target = TARGET_BPB[case.source]
    reached = next((p["train_s"] for p in curve if p["val_bpb"] <= target), None)
    return {
        "corpus": case.source, "tokenizer": case.tokenizer, "recipe": case.recipe,
        "steps": curve[-1]["step"], "train s": curve[-1]["train_s"],
        "best bpb": min(p["val_bpb"] for p in curve), "target bpb": target,
        "s to target": reached if reached is not None else "not reached",
        "train_flags": flags, "corpus_flags": case.corpus_flags, "curve": curve,
    }


def cases(quick: bool) -> list[Case]:
    default = CorpusConfig.__dataclass_fields__["tokenizer"].default
    other = "char" if default == "gpt2" else "gpt2"
    if quick:  # the same comparison in a few seconds: only the machinery, not the numbers
        return [Case("comedy", "char", "reference", {"time_budget": 3}),
                Case("comedy", default, "default", {"time_budget": 3})]
    return [
        Case("comedy", "char", "reference"), Case("comedy", default, "default"),
        Case("plays", "char", "reference"), Case("plays", default, "default"),
        Case("plays", other, "default"),
    ]


def run(quick: bool) -> Result:
    todo = cases(quick)
    result = Result(
        "time_to_quality",
        {"threads": THREADS, "checkpoints_per_run": CHECKPOINTS, "eval_bytes": EVAL_BYTES,
         "time": "training only (the trainer's clock, checkpoint writes included); evaluation "
                 "afterwards from the checkpoints, not counted",
         "reference": REFERENCE, "quick": quick},
        COLUMNS,
    )
    with tempfile.TemporaryDirectory(prefix="ttq-") as tmp:
        for i, case in enumerate(todo):
            print(f"time_to_quality: {case.recipe} on {case.source} ({case.tokenizer}) ...",
                  flush=True)
            result.rows.append(run_case(case, Path(tmp), f"{i}-{case.recipe}"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.time_to_quality",
                                     description="one time-to-quality case, with extra flags")
    parser.add_argument("--source", choices=SOURCES, default="comedy")
    parser.add_argument("--tokenizer", choices=("gpt2", "char"), default="gpt2")
    parser.add_argument("--recipe", choices=("default", "reference"), default="default")
    parser.add_argument("flags", nargs=argparse.REMAINDER,
                        help="after --: corpus or train flags, e.g. -- --max_vocab 4096 "
                             "--n_layer 6 --learning_rate 2e-3")
    args = parser.parse_args()
    case = Case.parse(args.source, args.tokenizer, args.recipe,
                      [a for a in args.flags if a != "--"])
    with tempfile.TemporaryDirectory(prefix="ttq-") as tmp:
        row = run_case(case, Path(tmp), "trial")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
