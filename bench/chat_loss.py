"""Assistant-only loss vs loss on every token (issue 58, goal 6), on the shipped conversations.

One `load-corpus --chat true` of gpt/assets/comedy_chat.jsonl.gz (bench/comedy_chat.py: a
speech of The Comedy of Errors as the user's turn, the next speaker's reply as the assistant's),
then two `train-gpt` runs on the same rendered rows with the same budget (model, batch,
iterations, seed):

- **assistant only**: the product's chat training, the loss on the tokens data/train.mask counts
  (the assistant's content and the `<|im_end|>` ending its turn);
- **every token**: the same run with data/train.mask rewritten, in the benchmark's own copy of
  the data, to count every token but the rows' end-of-text padding (system and user turns,
  markers and roles too): what training on the rendered text as plain text would do.

Both keep data/val.mask as load-corpus wrote it, so the measure is the same for both: the
validation loss (and bits per byte) on the assistant's tokens of the held-out conversations (the
last tenth), at the end. Every stage runs as the command a user runs (`python -m gpt ...`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.comedy_chat import SHIPPED
from bench.finetune import gpt
from bench.harness import Result

BLOCK = 256
FULL = {"max_iters": 300, "eval_interval": 50, "batch_size": 8}  # the default model, 4 x 4 x 128
QUICK = {"max_iters": 10, "eval_interval": 10, "batch_size": 4, "n_layer": 1, "n_head": 2,
         "n_embd": 32, "eval_iters": 2}  # fmt: skip


def count_every_token(run: Path) -> None:
    """Rewrite the run's data/train.mask to count every token but the padding."""
    meta = json.loads((run / "data" / "meta.json").read_text())
    tokens = np.fromfile(run / "data" / "train.bin", dtype=meta["dtype"])
    (tokens != meta["eot_id"]).astype(np.uint8).tofile(run / "data" / "train.mask")


def final(run: Path) -> dict:
    """The run's last evaluation: iteration, time, validation loss and bits per byte."""
    lines = (run / "metrics" / "train.jsonl").read_text().splitlines()
    last = [r for r in map(json.loads, lines) if "val_bpb" in r][-1]
    return {"iterations": last["step"], "train_s": round(last["elapsed_s"], 1),
            "val_loss": round(last["val_loss"], 4), "val_bpb": round(last["val_bpb"], 4)}


def run(quick: bool = False, source: Path = SHIPPED) -> Result:
    budget = QUICK if quick else FULL
    result = Result("chat_loss", {"source": str(source), "block_size": BLOCK, **budget,
                                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                    ["loss_on", "counted_train_tokens", "iterations", "train_s", "val_loss",
                     "val_bpb"])  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-chat-loss-") as tmp:
        root = Path(tmp)
        gpt("load-corpus", "--root", str(root), "--run", "assistant", "--source", str(source),
            "--chat", "true", "--block_size", str(BLOCK))  # fmt: skip
        shutil.copytree(root / "assistant" / "data", root / "every" / "data")
        count_every_token(root / "every")
        flags = ["--block_size", str(BLOCK),
                 *[a for k, v in budget.items() for a in (f"--{k}", str(v))]]
        for name, case in (("assistant", "assistant tokens"), ("every", "every token")):
            gpt("train-gpt", "--root", str(root), "--run", name, *flags)
            counted = int(np.fromfile(root / name / "data" / "train.mask", np.uint8).sum())
            result.rows.append({"loss_on": case, "counted_train_tokens": counted,
                                **final(root / name)})  # fmt: skip
    result.settings["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


if __name__ == "__main__":
    print(run("--quick" in sys.argv).markdown())
