"""Checkpoints: `ckpt/step-<N>/` directories, and `ckpt/LATEST` naming the newest complete one.

A checkpoint is written whole under a temporary name and renamed into place, and only then is
LATEST rewritten (atomically): a process killed at any moment leaves LATEST on a complete
checkpoint, and a half-written one is never picked up. Each holds

  model.safetensors  the weights (safetensors: tensors only, no code can hide in it)
  optimizer.pt       AdamW's state_dict, loaded with weights_only=True (tensors and numbers only)
  state.json         the trainer state (step, which is also the data position; elapsed time), the
                     config, and the identity of the data it was trained on
  rng.json           every rank's RNG states: torch (and CUDA), numpy, python
  average.safetensors  the moving average of the weights (gpt/ema.py), if the run keeps one
                     (--ema_decay): what it evaluates and exports
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch

from gpt import atomic, faults
from gpt.errors import InputError, first_line
from gpt.rundir import RunDir

MODEL, OPTIMIZER, STATE, RNG = "model.safetensors", "optimizer.pt", "state.json", "rng.json"
FILES = (MODEL, OPTIMIZER, STATE, RNG)  # every checkpoint has these
AVERAGE = "average.safetensors"  # and one of a run with a weight average, this
_STEP_DIR = re.compile(r"^step-(\d+)$")


def save(run: RunDir, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         state: dict[str, Any], rngs: list[dict[str, Any]], keep_last: int,
         average: torch.nn.Module | None = None) -> Path:
    """Write `ckpt/step-<step>/` (with the weight average `average`, if given), point LATEST at
    it, and drop all but the newest `keep_last`."""
    dest = run.ckpt_step(step)
    what = f"checkpoint step {step}"
    with atomic.staged_dir(dest, what=what) as stage:
        # save_model, not save_file: the tied embedding and head share one tensor.
        safetensors.torch.save_model(model, str(stage / MODEL))
        if average is not None:
            safetensors.torch.save_model(average, str(stage / AVERAGE))
        # Into a Python file, not to a path: torch's own file writer reports a full volume as
        # "unexpected pos" and nothing more; Python's write raises the OSError it is.
        with open(stage / OPTIMIZER, "wb") as f:
            torch.save(optimizer.state_dict(), f)
        (stage / STATE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        (stage / RNG).write_text(json.dumps({str(r): s for r, s in enumerate(rngs)}) + "\n")
        faults.checkpoint_staged(step)
    atomic.write_text(run.latest, dest.name + "\n", what=f"the pointer to {what}")
    prune(run, keep_last)
    return dest


def _step_dirs(run: RunDir) -> list[tuple[int, Path]]:
    if not run.ckpt_dir.is_dir():
        return []
    found = ((_STEP_DIR.match(p.name), p) for p in run.ckpt_dir.iterdir() if p.is_dir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


def prune(run: RunDir, keep_last: int) -> None:
    """Remove all but the newest `keep_last` checkpoints (never the one LATEST names), and the
    staging directories of writes that were cut off."""
    latest = find_latest(run)
    for _, path in _step_dirs(run)[:-keep_last]:
        if path != latest:
            shutil.rmtree(path, ignore_errors=True)
    for stale in run.ckpt_dir.glob(".step-*.staging"):
        shutil.rmtree(stale, ignore_errors=True)


def clear(run: RunDir) -> None:
    """Remove every checkpoint (a fresh start)."""
    shutil.rmtree(run.ckpt_dir, ignore_errors=True)


def find_latest(run: RunDir) -> Path | None:
    """The checkpoint LATEST names, or None if there is none; a broken one is an InputError."""
    if not run.latest.is_file():
        return None
    name = run.latest.read_text().strip()
    if not _STEP_DIR.match(name):
        raise InputError(f"{run.latest}: does not name a checkpoint ({name[:40]!r})")
    path = run.ckpt_dir / name
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise InputError(
            f"{run.latest} names {name}, which lacks {', '.join(missing)}; "
            f"remove {run.ckpt_dir} or pass --resume never to start over"
        )
    return path


def read_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """state.json and rng.json of checkpoint `path` (an older state.json with the keys it
    lacks at the values it implied)."""
    out = []
    for name in (STATE, RNG):
        try:
            out.append(json.loads((path / name).read_text()))
        except (OSError, ValueError) as e:
            raise InputError(f"{path / name}: truncated or corrupt checkpoint file ({e})") from None
    state, rng = out
    # A checkpoint from before --spelling has a plain embedding table.
    state.get("model", {}).setdefault("spelling", 0)
    return state, rng


def load_weights(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, average: torch.nn.Module | None = None) -> None:
    """Load model and optimizer state (and the weight average into `average`, if given) from
    checkpoint `path`, refusing anything but tensors."""
    if average is not None and not has_average(path):
        raise InputError(
            f"{path}: has no {AVERAGE}: it was trained without a weight average; pass "
            "--ema_decay 0 to continue it, or --resume never to start over"
        )
    try:
        opt_state = torch.load(path / OPTIMIZER, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only allows tensors, numbers and containers; a checkpoint we wrote holds
        # nothing else, so anything more is a tampered or foreign file: never run it.
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        what = f"it would call {found.group(1)}" if found else "weights_only load failed"
        raise InputError(
            f"{path / OPTIMIZER}: refused, it holds Python objects, not only tensors ({what})"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise InputError(f"{path / OPTIMIZER}: truncated or corrupt checkpoint file "
                         f"({first_line(e)})") from None
    for name, module in ((MODEL, model), (AVERAGE, average)):
        if module is None:
            continue
        try:
            safetensors.torch.load_model(module, str(path / name), strict=True,
                                         device=str(device))
        except (safetensors.SafetensorError, RuntimeError, OSError) as e:
            raise InputError(f"{path / name}: truncated or corrupt checkpoint file "
                             f"({first_line(e)})") from None
    try:
        optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError) as e:
        raise InputError(
            f"{path / OPTIMIZER}: does not fit this model ({first_line(e)})"
        ) from None


def has_average(path: Path) -> bool:
    """Whether checkpoint `path` is of a run that keeps a weight average."""
    return (path / AVERAGE).is_file()


def evaluated_weights(path: Path) -> Path:
    """The weights file of checkpoint `path` that the run evaluates and exports: the weight
    average if the run keeps one, else the weights."""
    return path / AVERAGE if has_average(path) else path / MODEL


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states, as JSON."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    state = {
        "torch": torch.get_rng_state().tolist(),
        "numpy": np_state,
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).tolist()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"], "key": np.array(np_state["state"]["key"], np.uint32)}
    np.random.set_state(np_state)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8), device)
