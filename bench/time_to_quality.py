"""Time to quality: how good the model gets per second of training, nanoGPT vs our default recipe.

On each corpus (the embedded comedy, the 41 plays), in one run, every trainer as the program a
user runs, so threads and memory are its own:

- **nanoGPT** (the reference): ../shared/peers/nanogpt, unchanged, run as `python train.py` in a
  working directory of its files, with its CPU "baby GPT" (`BABY_GPT`: characters, 4 layers x 4
  heads x 128, block 64, batch 12, lr 1e-3 -> 1e-4, warmup 100, 2000 iterations, dropout 0;
  every flag passed), on the character tokens `python -m gpt load-corpus --tokenizer char` writes;
- **default**: `python -m gpt load-corpus` and `python -m gpt train-gpt` with their default flags
  (on the plays also with the other tokenizer).

All hold out the last 10% of the text. Quality is measured one way for all: after training,
this process evaluates checkpoints (`evaluate`: the same evenly spread windows of val.bin, bits
per byte), so evaluation costs no trainer anything. Ours checkpoints every 1/CHECKPOINTS of its
steps; nanoGPT once, after its last iteration (its `ckpt.pt`, read as weights only into this
project's GPT with GPT-2's choices, which is nanoGPT's model tensor for tensor, by the same names).

Training time, the clock each trainer runs by:

- **ours**: the trainer's own clock, the one `--time_budget` reads and each checkpoint records:
  from the first step to the last, checkpoint writes included, process start and data loading not;
- **nanoGPT**: this process timestamps its `iter N:` lines as they arrive (it logs every
  iteration). N iterations take the time from the line of iteration 0 to that of iteration N-1,
  times N/(N-1): the line of iteration 0 also waits for the evaluation nanoGPT runs before it, so
  its step counts as an average one. Process start, data loading, its evaluations (at iterations
  0 and N) and its checkpoint write are not counted, nor the extra iteration N it trains after
  that checkpoint. Both differences from ours (the first step, the checkpoint writes) are in
  nanoGPT's favour, by well under a second.

The target on each corpus is nanoGPT's bits per byte after its 2000 iterations. Each row reports
the training time of its first checkpoint at or below it (an upper bound, to one checkpoint
interval) and that time over nanoGPT's training time (issue 22's goal on the plays: at most 0.15x).

`python -m bench.time_to_quality --source plays --tokenizer gpt2 -- --n_layer 6 ...` runs one
case with extra flags (corpus-stage flags such as --max_vocab go to the corpus stage, the rest to
training) and prints its row, timed to TARGET_BPB or --target: how each trial in
bench/recipe_trials.md was measured. `--trainer nanogpt` runs nanoGPT's recipe alone (the flags
after -- in nanoGPT's names, e.g. -- --max_iters 500).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from bench import texts, vs_nanogpt
from bench.harness import SHARED, Result
from gpt.config.configs import CorpusConfig, GPTConfig, TrainConfig
from gpt.models.export import load_unpadded
from gpt.models.model import GPT
from gpt.models.spelling import spelling_of
from gpt.rundir.layout import DataMeta, RunDir
from gpt.stages import to_args
from gpt.tokenizer.kinds import load_tokenizer
from gpt.training import checkpoint_files
from gpt.training.batches import eval_batches, eval_offsets

REPO = Path(__file__).resolve().parents[1]
# Each corpus's --source, found when a case needs it (the German text is fetched on first use).
SOURCES: dict[str, Callable[[], str]] = {
    "comedy": lambda: "default",  # the embedded Comedy of Errors, what `make demo` trains on
    "plays": lambda: str(SHARED / "data" / "shakespeare_plays.txt"),
    "german": lambda: str(texts.german_fortunes()),  # issue 22's third text (bench/texts.py)
}
# The target of a single trial, which runs no nanoGPT beside it (`--target` overrides): issue 8's
# goal on the default corpus, and the plays' reference quality it measured. The benchmark's
# target is nanoGPT's quality, measured in the same run.
TARGET_BPB = {"comedy": 2.02, "plays": 2.708}
# nanoGPT's CPU "baby GPT": its README's Shakespeare-by-characters command on a CPU over
# config/train_shakespeare_char.py's optimizer, in the flag names both trainers share.
BABY_GPT = {
    "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
    "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "max_iters": 2000,
    "dropout": 0.0, "weight_decay": 0.1, "beta2": 0.99, "grad_clip": 1.0, "bias": False,
}  # fmt: skip
# The same recipe through this project's trainer (`--recipe reference`), with nanoGPT's model.
REFERENCE = {**BABY_GPT, "time_budget": 0, **vs_nanogpt.GPT2_CHOICES}
# nanoGPT's own evaluation (at iterations 0 and max_iters): as its README's baby GPT. Neither
# timed nor used, except as a cross-check of ours (`own_val_bpb`).
NANOGPT_EVAL_ITERS = 20
NANOGPT_VAL_LINE = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")
CHECKPOINTS = 40  # evaluation points per run of ours (every 15 of 600 steps: a tight upper bound)
# Validation text per evaluation, at most: what 200 batches of the baby GPT's 12 x 64
# characters cover, so every tokenizer is scored on about the same text.
EVAL_BYTES = 200 * 12 * 64
# Threads per training process: OMP_NUM_THREADS if set, else one per core.
THREADS = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
COLUMNS = ["corpus", "tokenizer", "trainer", "recipe", "steps", "train s", "best bpb",
           "target bpb", "s to target", "vs nanoGPT's time"]


@dataclass
class Case:
    source: str  # a key of SOURCES
    tokenizer: str  # gpt2 or char
    recipe: str  # "reference" (BABY_GPT) or "default"
    trainer: str = "ours"  # or "nanogpt", which runs the reference recipe only
    train_flags: dict[str, Any] = field(default_factory=dict)  # on top of the recipe's
    corpus_flags: dict[str, Any] = field(default_factory=dict)  # on top of the corpus defaults

    def flags(self) -> dict[str, Any]:
        """The trainer's flags: ours' beyond its defaults, or every one of nanoGPT's."""
        if self.trainer == "nanogpt":
            return nanogpt_flags(self.train_flags)
        return {**(REFERENCE if self.recipe == "reference" else {}), **self.train_flags}

    @classmethod
    def parse(cls, source: str, tokenizer: str, recipe: str, args: list[str],
              trainer: str = "ours") -> Case:
        """A case from `--flag value` pairs: the corpus stage's own flags go to it, the rest to
        training (block_size, which both have, to training: the corpus stage only checks it)."""
        pairs = dict(zip((k.lstrip("-") for k in args[::2]), args[1::2], strict=True))
        corpus_only = CorpusConfig.__dataclass_fields__.keys() - TrainConfig.__dataclass_fields__
        corpus = {k: v for k, v in pairs.items() if k in corpus_only}
        train = {k: v for k, v in pairs.items() if k not in corpus_only}
        return cls(source, tokenizer, recipe, trainer, train, corpus)


def nanogpt_flags(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every flag of nanoGPT's train.py that shapes a run: the baby GPT with `overrides` (in
    nanoGPT's names), one CPU process in float32 without compiling, the learning rate decayed
    over max_iters, one checkpoint (always written) at its end, and a line every iteration."""
    recipe = {**BABY_GPT, **overrides}
    iters = int(recipe["max_iters"])
    return {
        "dataset": vs_nanogpt.DATASET, "out_dir": "out", "init_from": "scratch",
        "device": "cpu", "compile": False, "dtype": "float32",
        "gradient_accumulation_steps": 1, "beta1": 0.9, "decay_lr": True, "lr_decay_iters": iters,
        "eval_interval": iters, "eval_iters": NANOGPT_EVAL_ITERS, "always_save_checkpoint": True,
        "eval_only": False, "log_interval": 1, "wandb_log": False, **recipe,
    }  # fmt: skip


def _gpt(args: list[str], log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    with log.open("a") as out:
        out.write(f"$ python -m gpt {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run([sys.executable, "-m", "gpt", *args], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode:
        raise RuntimeError(f"python -m gpt {' '.join(args)} failed:\n{log.read_text()[-2000:]}")


def our_model(ckpt: Path) -> GPT:
    """The model of one of our checkpoints (in run/ckpt/, its tokenizer in run/data/)."""
    state = json.loads((ckpt / "state.json").read_text())
    config = GPTConfig(**state["model"])
    tokenizer = load_tokenizer(RunDir.of(ckpt.parents[2], ckpt.parents[1].name).tokenizer_json)
    model = GPT(config, spelling_of(tokenizer, config.spelling))
    safetensors.torch.load_model(model, str(checkpoint_files.evaluated_weights(ckpt)))
    return model


def nanogpt_model(path: Path, meta: DataMeta, iters: int) -> GPT:
    """nanoGPT's checkpoint `path`, after `iters` iterations on `meta`'s tokens, as this project's
    GPT with GPT-2's choices: nanoGPT's model, by the same tensor names, but for the padding rows
    of the embedding. Read as weights only: the checkpoint's code, if any, never runs."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    args = saved["model_args"]
    if (saved["iter_num"], args["vocab_size"]) != (iters, meta.vocab_size):
        raise RuntimeError(f"{path}: iteration {saved['iter_num']} of vocabulary "
                           f"{args['vocab_size']}, expected {iters} of {meta.vocab_size}")
    shape = {k: args[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias")}
    config = GPTConfig(**shape, vocab_size=meta.vocab_size, dropout=0.0, **vs_nanogpt.GPT2_CHOICES)
    model = GPT(config)
    load_unpadded(model, saved["model"])  # strict: every tensor by name and shape
    return model


@torch.no_grad()
def evaluate(model: GPT, data: Path, meta: DataMeta) -> float:
    """Validation bits per byte of `model`, on evenly spread windows of `data`/val.bin."""
    model.eval()
    tokens = np.memmap(data / "val.bin", dtype=meta.dtype, mode="r")
    block = model.config.block_size
    bytes_per_window = block * meta.val_bytes / meta.val_tokens
    offsets = eval_offsets(len(tokens), block, max(1, round(EVAL_BYTES / bytes_per_window)))
    total = 0.0
    for x, y in eval_batches(tokens, offsets, block, 64, torch.device("cpu")):
        total += model(x, y)[1].item() * len(x)
    return meta.bits_per_byte(total / len(offsets))


def nanogpt_train_s(arrivals: list[tuple[int, float]], iters: int) -> float:
    """nanoGPT's training time of `iters` iterations from the arrival times of its `iter N:`
    lines: iterations 1 .. iters-1 as they came, iteration 0 as their average (docstring)."""
    at = dict(arrivals)
    if iters < 2 or not {0, iters - 1} <= at.keys():
        raise RuntimeError(f"nanoGPT logged no line of iteration 0 or {iters - 1} of {iters}")
    return (at[iters - 1] - at[0]) * iters / (iters - 1)


def train_ours(flags: dict[str, Any], root: Path, name: str, data_run: str, log: Path,
               meta: DataMeta) -> list[dict[str, Any]]:
    """Train `flags` in run `root/name` on `data_run`'s token files; the evaluated checkpoints."""
    (root / name).mkdir()
    for part in ("corpus", "data"):
        (root / name / part).symlink_to(root / data_run / part)
    max_iters = int(flags.get("max_iters", TrainConfig.max_iters))
    # When to checkpoint and evaluate: nothing that changes the training.
    bench_flags = {"ckpt_interval": max(1, max_iters // CHECKPOINTS), "eval_interval": max_iters,
                   "keep_last": 10**6, "resume": "never"}
    _gpt(["train-gpt", "--root", str(root), "--run", name, *to_args({**bench_flags, **flags})], log)
    data, curve = root / data_run / "data", []
    for ckpt in sorted((root / name / "ckpt").glob("step-*"), key=lambda p: int(p.name[5:])):
        train = json.loads((ckpt / "state.json").read_text())["train"]
        curve.append({"step": train["step"], "train_s": round(train["elapsed_s"], 2),
                      "val_bpb": round(evaluate(our_model(ckpt), data, meta), 4)})
    return curve


def train_nanogpt(flags: dict[str, Any], work: Path, data: Path, log: Path,
                  meta: DataMeta) -> tuple[list[dict[str, Any]], float]:
    """Train nanoGPT with `flags` in working directory `work` on `data`'s token files; its one
    evaluated checkpoint, and nanoGPT's own estimate of its validation bits per byte there."""
    if meta.dtype != "uint16":
        raise RuntimeError(f"{data}: nanoGPT reads uint16 token files only")
    iters = int(flags["max_iters"])
    vs_nanogpt.nanogpt_workdir(work, data, meta.vocab_size)
    argv = vs_nanogpt.nanogpt_argv(flags)
    run = vs_nanogpt.timed_run(argv, work, "nanogpt", log, cuda=False, threads=THREADS)
    model = nanogpt_model(work / flags["out_dir"] / "ckpt.pt", meta, iters)
    own = [m[2] for m in map(NANOGPT_VAL_LINE.match, log.read_text().splitlines())
           if m and int(m[1]) == iters]
    point = {"step": iters, "train_s": round(nanogpt_train_s(run["arrivals"], iters), 2),
             "val_bpb": round(evaluate(model, data, meta), 4)}
    return [point], round(meta.bits_per_byte(float(own[-1])), 4)


def run_case(case: Case, root: Path, name: str) -> dict[str, Any]:
    """Train one case in `root/name` (its data shared per corpus and tokenizer); its row, without
    a target (`score`)."""
    log = root / f"{name}.log"
    corpus_flags = {"source": SOURCES[case.source](), "tokenizer": case.tokenizer,
                    "block_size": BABY_GPT["block_size"], **case.corpus_flags}
    data_run = "-".join(["data", case.source, case.tokenizer,
                         *(f"{k}{v}" for k, v in sorted(case.corpus_flags.items()))])
    if not (root / data_run / "data").is_dir():
        _gpt(["load-corpus", "--root", str(root), "--run", data_run, *to_args(corpus_flags)], log)
    meta = DataMeta.read(RunDir.of(root, data_run).meta_json)
    flags = case.flags()
    row: dict[str, Any] = {"corpus": case.source, "tokenizer": case.tokenizer,
                           "trainer": case.trainer, "recipe": case.recipe}
    if case.trainer == "nanogpt":
        curve, row["own_val_bpb"] = train_nanogpt(flags, root / name, root / data_run / "data",
                                                  log, meta)
    else:
        curve = train_ours(flags, root, name, data_run, log, meta)
    return {
        **row, "steps": curve[-1]["step"], "train s": curve[-1]["train_s"],
        "best bpb": min(p["val_bpb"] for p in curve), "train_flags": flags,
        "corpus_flags": case.corpus_flags, "curve": curve,
    }


def score(rows: list[dict[str, Any]], target: float, nanogpt_s: float | None) -> None:
    """Time each row to `target` (its first checkpoint at or below it) and, with nanoGPT's
    training time `nanogpt_s`, that time as a fraction of nanoGPT's."""
    for row in rows:
        reached = next((p["train_s"] for p in row["curve"] if p["val_bpb"] <= target), None)
        row["target bpb"] = target
        row["s to target"] = reached if reached is not None else "not reached"
        if nanogpt_s:
            row["time_ratio_to_nanogpt"] = reached / nanogpt_s if reached is not None else None
            row["vs nanoGPT's time"] = f"{reached / nanogpt_s:.2f}x" if reached is not None else "-"


def cases(quick: bool) -> list[Case]:
    default = CorpusConfig.__dataclass_fields__["tokenizer"].default
    other = "char" if default == "gpt2" else "gpt2"
    if quick:  # the same comparison in a few seconds: only the machinery, not the numbers
        return [Case("comedy", "char", "reference", "nanogpt", {"max_iters": 20}),
                Case("comedy", default, "default", train_flags={"time_budget": 3})]
    return [
        Case("comedy", "char", "reference", "nanogpt"), Case("comedy", default, "default"),
        Case("plays", "char", "reference", "nanogpt"), Case("plays", default, "default"),
        Case("plays", other, "default"),
        Case("german", "char", "reference", "nanogpt"), Case("german", default, "default"),
    ]


def run(quick: bool) -> Result:
    vs_nanogpt.require_nanogpt()
    todo = cases(quick)
    result = Result(
        "time_to_quality",
        {"threads": THREADS, "checkpoints_per_run": CHECKPOINTS, "eval_bytes": EVAL_BYTES,
         "nanogpt": str(vs_nanogpt.NANOGPT),
         "time": "training only: ours by its own clock (checkpoint writes included), nanoGPT by "
                 "its iteration lines (its first iteration as an average one, its evaluations "
                 "and checkpoint not counted); evaluation afterwards from the checkpoints",
         "target": "per corpus, nanoGPT's final bits per byte in the same run", "quick": quick},
        COLUMNS,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ttq-") as tmp:
        for i, case in enumerate(todo):
            print(f"time_to_quality: {case.trainer} {case.recipe} on {case.source} "
                  f"({case.tokenizer}) ...", flush=True)
            result.rows.append(run_case(case, Path(tmp), f"{i}-{case.trainer}-{case.recipe}"))
    for ref in [row for row in result.rows if row["trainer"] == "nanogpt"]:
        same = [row for row in result.rows if row["corpus"] == ref["corpus"]]
        score(same, ref["best bpb"], ref["train s"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.time_to_quality",
                                     description="one time-to-quality case, with extra flags")
    parser.add_argument("--source", choices=SOURCES, default="comedy")
    parser.add_argument("--tokenizer", choices=("gpt2", "char"), default="gpt2")
    parser.add_argument("--trainer", choices=("ours", "nanogpt"), default="ours",
                        help="nanogpt: ../shared/peers/nanogpt with the reference recipe")
    parser.add_argument("--recipe", choices=("default", "reference"),
                        help="ours' default flags, or nanoGPT's baby GPT (default: default for "
                             "ours, reference for nanogpt, which runs only that)")
    parser.add_argument("--target", type=float, metavar="BPB",
                        help="bits per byte to time (default: "
                             + ", ".join(f"{v} on {k}" for k, v in TARGET_BPB.items()) + ")")
    parser.add_argument("flags", nargs=argparse.REMAINDER,
                        help="after --: corpus or train flags, e.g. -- --max_vocab 4096 "
                             "--n_layer 6 --learning_rate 2e-3")
    args = parser.parse_args()
    recipe = args.recipe or ("reference" if args.trainer == "nanogpt" else "default")
    if args.trainer == "nanogpt":
        if recipe != "reference":
            parser.error("--trainer nanogpt runs --recipe reference only")
        vs_nanogpt.require_nanogpt()
    case = Case.parse(args.source, args.tokenizer, recipe, [a for a in args.flags if a != "--"],
                      args.trainer)
    with tempfile.TemporaryDirectory(prefix="ttq-") as tmp:
        row = run_case(case, Path(tmp), "trial")
    target = args.target or TARGET_BPB.get(args.source)
    if target:
        score([row], target, None)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
