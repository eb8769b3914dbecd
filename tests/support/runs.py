"""Tiny runs: the one set of tiny settings every test trains with, a small `data/` written
directly, and train-gpt run on it in this process or as a process of its own.

The data follows load-corpus's contract (docs/architecture.md; `data/meta.json` is
gpt/rundir/layout.py's `DataMeta`) but is written here with numpy, char-level, so the trainer's
tests do not depend on the corpus stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gpt.__main__ import main as gpt_main
from gpt.rundir.layout import DataMeta, RunDir
from gpt.stages import TRAIN_GPT
from gpt.tokenizer.kinds import CharTokenizer
from support.once import made_once

TEXT = (
    "ANTIPHOLUS: Merchant, I'll pay thee, and be gone.\n"
    "DROMIO: Master, the feast is cold, the meat is burnt.\n"
    "ADRIANA: Neither my husband nor the slave return.\n"
) * 40

# The tiny run: a model and run small enough for a few seconds on a shared 2-core CPU, in
# train-gpt's flag names (gpt/config/configs.py). Every test's tiny settings are these, or a variant
# below derived from them with the overrides it needs and why.
# (time_budget a float: the pipeline's parameter is one, and KFP refuses an integer there.)
TINY = {
    "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16,
    "batch_size": 8, "learning_rate": 3e-3, "min_lr": 3e-4, "warmup_iters": 3, "time_budget": 0.0,
    "eval_iters": 2, "log_interval": 1, "device": "cpu",
}  # fmt: skip

# The tiny model's shape alone, for tests that build a GPTConfig or TrainConfig themselves.
TINY_MODEL = {k: TINY[k] for k in ("n_layer", "n_head", "n_embd", "block_size")}

# A model whose export transformers must compute as ours does, block for block: two blocks, so
# that weights landing in another block's place show, and a context of 32 positions.
TINY_TWO_BLOCKS = {**TINY_MODEL, "n_layer": 2, "block_size": 32}

# Several ranks that must train as one process would: no dropout, whose masks are per-rank random
# draws.
TINY_DDP = {**TINY, "dropout": 0}

# The tiny run through the whole pipeline (load-corpus -> train-gpt -> generative-prompt), as the
# pipeline's parameters: TINY less the knobs the pipeline does not have (min_lr, left at its
# default; device, chosen by the stage), characters for tokens (no tokenizer to train), 20 steps
# with an evaluation halfway, and a short reply to two prompts.
TINY_PIPELINE = {
    **{k: v for k, v in TINY.items() if k not in ("min_lr", "device")},
    "tokenizer": "char", "max_iters": 20, "eval_interval": 10, "max_new_tokens": 16,
    "prompt": ["To be", "or not"],
}  # fmt: skip


# The tiny run fine-tuning a pretrained model (--init_from): TINY less the shape, which is the
# checkpoint's (tests/support/gpt2.py's small GPT-2, its 64 positions cropped to 16), and less
# the schedule, which is the fine-tuning recipe's.
TINY_FINETUNE = {k: v for k, v in TINY.items()
                 if k not in ("n_layer", "n_head", "n_embd", "learning_rate", "min_lr",
                              "warmup_iters")}  # fmt: skip


def as_flags(settings: dict) -> list[str]:
    """`{"n_layer": 1}` as a command line: `["--n_layer", "1"]`."""
    return [a for k, v in settings.items() for a in (f"--{k}", str(v))]


TINY_FLAGS = as_flags(TINY)


def write_data(root: Path, run: str, text: str = TEXT, val_fraction: float = 0.1) -> RunDir:
    """`<root>/<run>/data/` for `text`, one token per character, last `val_fraction` held out."""
    rundir = RunDir.of(root, run)
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    cut = int(len(text) * (1 - val_fraction))
    rundir.data_dir.mkdir(parents=True, exist_ok=True)
    ids[:cut].tofile(rundir.train_bin)
    ids[cut:].tofile(rundir.val_bin)
    rundir.tokenizer_json.write_text(json.dumps(CharTokenizer("".join(chars)).to_json()))
    DataMeta(
        source="tests", tokenizer="char", compact=False, max_vocab=0, val_fraction=val_fraction,
        block_size=16, corpus_sha256=hashlib.sha256(text.encode()).hexdigest(),
        vocab_size=len(chars), eot_id=None, dtype="uint16",
        train_tokens=cut, val_tokens=len(text) - cut,
        train_bytes=len(text[:cut].encode()), val_bytes=len(text[cut:].encode()),
    ).write(rundir.meta_json)
    return rundir


# One thread: as fast for a tiny model, and two threads on two cores that other processes share
# run several times slower (OpenMP threads wait on each other while descheduled).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def train(root: Path, run: str, *flags: str) -> int:
    """`python -m gpt train-gpt` of the tiny run in this process (fast: no interpreter to
    start); its exit code."""
    return in_process("train-gpt", "--root", str(root), "--run", run, *TINY_FLAGS, *flags)


def in_process(*argv: str) -> int:
    """`python -m gpt <argv>` in this process, on one thread as the tests' own processes are
    (ONE_THREAD: a run's numbers are then those of the same command as a process); its exit
    code."""
    threads = torch.get_num_threads()
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ.update(ONE_THREAD)
    torch.set_num_threads(1)
    try:
        return gpt_main(list(argv))
    finally:
        torch.set_num_threads(threads)
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def train_cli(root: Path, run: str, *flags: str, env: dict | None = None,
              torchrun: list[str] | None = None) -> subprocess.CompletedProcess:
    """The same as a separate process, optionally under `torchrun <torchrun args>` (the stage's
    own command line: `-- train-gpt` after torchrun's options)."""
    cmd = TRAIN_GPT.command(
        ["--root", str(root), "--run", run, *TINY_FLAGS, *flags],
        python=[sys.executable],
        torchrun=[sys.executable, "-m", "torch.distributed.run", *torchrun] if torchrun else None,
    )
    env = {**(env or os.environ), **ONE_THREAD}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


# The README's default recipe (model, optimizer, schedule, data order), 40 iterations: a warmup
# of 10 and the decay after it, with a checkpoint every 10 to resume from. (100 took a fifth of
# the suite's time in the five runs of the default model its tests make.)
DEFAULT_FLAGS = ["--max_iters", "40", "--ckpt_interval", "10"]


def default_flags_run(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """train-gpt with the default flags (but DEFAULT_FLAGS) on `write_data`'s text, as its own
    process and never stopped: what the tests of the README's default-flags promises compare
    with, trained once per session."""

    def run(folder: Path) -> None:
        write_data(folder, "default")
        argv = ["train-gpt", "--root", str(folder), "--run", "default", *DEFAULT_FLAGS]
        out = subprocess.run([sys.executable, "-m", "gpt", *argv], capture_output=True,
                             text=True, env={**os.environ, **ONE_THREAD}, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]

    return RunDir.of(made_once(tmp_path_factory, "default-flags", run), "default")


# A run long enough to be stopped anywhere in it, with a checkpoint halfway; a progress line
# every step says where it is.
STOPPABLE = {"max_iters": 100, "eval_interval": 50, "ckpt_interval": 50, "log_interval": 1}

# torchrun's options for two ranks on this machine.
TWO_RANKS = ["--standalone", "--nproc_per_node=2"]


def why_ranks_failed(stderr: str) -> str:
    """What a failed torchrun said: its ranks' error lines (a C++ abort's `what()`, a Python
    error), which its own summary at the end pushes out of a tail, then that tail."""
    said = [line for line in stderr.splitlines()
            if any(w in line for w in ("Error", "error:", "what()", "terminate called"))]
    return "\n".join(said[:20]) + "\n...\n" + stderr[-1500:]


def uninterrupted(tmp_path_factory: pytest.TempPathFactory, ranks: int,
                  shard: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """The weights of TINY_DDP trained STOPPABLE by `ranks` ranks (1 or 2), sharded (--shard) or
    not, and never stopped: what every test that stops such a run compares its end with,
    whether the ranks are processes here, a pod's, or the test cluster's nodes (rank for rank
    the same training)."""
    return model_weights(uninterrupted_run(tmp_path_factory, ranks, shard))


def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory, ranks: int,
                      shard: bool = False) -> RunDir:  # fmt: skip
    """The run `uninterrupted` exported, trained once per session: one rank in the asking
    worker's process, two by torchrun here. Read it, never write it: other tests share it."""

    def run(folder: Path) -> None:
        write_data(folder, "whole")
        flags = as_flags({**TINY_DDP, **STOPPABLE}) + (["--shard", "true"] if shard else [])
        if ranks == 1:
            assert train(folder, "whole", *flags) == 0
            return
        done = train_cli(folder, "whole", *flags, torchrun=TWO_RANKS)
        assert done.returncode == 0, why_ranks_failed(done.stderr)

    name = f"uninterrupted-{ranks}{'-sharded' if shard else ''}"
    return RunDir.of(made_once(tmp_path_factory, name, run), "whole")


def model_weights(rundir: RunDir) -> dict[str, torch.Tensor]:
    """The weights a run exported (model/model.safetensors)."""
    return load_file(rundir.model_dir / "model.safetensors")


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                        what: str = "the weights") -> None:  # fmt: skip
    """The same names and, under each, bit for bit the same tensor; a failure names what differs."""
    assert got.keys() == want.keys(), f"{what}: names differ: {sorted(got.keys() ^ want.keys())}"
    for name, tensor in got.items():
        assert torch.equal(tensor, want[name]), f"{what}: {name} differs"


def records(rundir: RunDir) -> list[dict]:
    return [json.loads(line) for line in rundir.train_jsonl.read_text().splitlines()]
