"""Models for tests: a run's model as train-gpt leaves it (untrained, or with peaked weights), and
generative-prompt run on it as a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import torch

from gpt.models.export import save_export
from gpt.models.model import GPT, GPTConfig
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import Tokenizer
from support.runs import ONE_THREAD, TINY_MODEL, in_process

RUN = "t"  # the run `export` writes
ENV = {**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1"}

CORPUS = (resources.files("gpt.assets") / "comedy_of_errors.txt").read_text(encoding="utf-8")
PROMPTS = [
    "ANTIPHOLUS OF SYRACUSE. What is thy name?",  # the corpus
    "The quick brown fox jumps over the lazy dog near the riverbank.",  # another text
    "Café — naïve; 日本, 😀!",  # Unicode, CJK and emoji: 28 ids of 64, most of them bytes
]


def export(root: Path, tokenizer: Tokenizer, vocab_size: int | None = None) -> RunDir:
    """What train-gpt leaves behind: a (here untrained) model exported into `<root>/t/model/`."""
    torch.manual_seed(0)
    # The tiny model, 32 positions long (room for the tests' prompts and replies) and half as
    # wide (an untrained model: its width changes nothing the tests read)
    config = GPTConfig(**{**TINY_MODEL, "block_size": 32, "n_embd": 16},
                       vocab_size=vocab_size or tokenizer.vocab_size)
    rundir = RunDir.of(root, RUN)
    save_export(GPT(config), tokenizer, rundir.model_dir)
    return rundir


def peaked(config: GPTConfig, seed: int = 0) -> GPT:
    """A model with weights far from uniform, so that greedy choices have clear margins."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
            else:
                p.normal_(0.0, 0.3 if "wte" in name or "wpe" in name else 0.1)
    return model


def args(rundir: RunDir, *extra: str) -> list[str]:
    """generative-prompt's command line on `rundir`, after the Python executable."""
    return ["-m", "gpt", "generative-prompt", "--root", str(rundir.root), "--run", RUN, *extra]


def one_shot(rundir: RunDir, *extra: str) -> subprocess.CompletedProcess:
    """generative-prompt with no terminal and no stdin (what a pipeline step runs)."""
    return subprocess.run(
        [sys.executable, *args(rundir, *extra)], capture_output=True, text=True, env=ENV,
        timeout=60, stdin=subprocess.DEVNULL,
    )


def cli_replies(run: RunDir, prompts: list[str], n: int, *extra: str) -> list[str]:
    """Our CLI's greedy replies of `n` tokens (--prompt repeated), as its transcript records
    them: what a server of the run's model/ must answer."""
    return [record["reply"] for record in cli_transcript(run, prompts, n, *extra)]


def cli_transcript(run: RunDir, prompts: list[str], n: int, *extra: str) -> list[dict]:
    """The transcript's records of `cli_replies`'s run (`extra`: more flags, --system S): the
    CLI in this process (`in_process`, one thread as the CLI's processes here), not one more
    interpreter to start."""
    flags = [a for prompt in prompts for a in ("--prompt", prompt)]
    assert in_process("generative-prompt", "--root", str(run.root), "--run", run.run_id,
                      "--temperature", "0", "--max_new_tokens", str(n), *flags, *extra) == 0
    lines = run.transcript_jsonl.read_text().splitlines()
    return [json.loads(line) for line in lines[-len(prompts):]]
