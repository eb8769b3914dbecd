"""Checkpoints: `ckpt/step-<N>/` directories, and `ckpt/LATEST` naming the newest complete one.

A checkpoint is written whole under a temporary name and renamed into place, and only then is
LATEST rewritten (atomically): a process killed at any moment leaves LATEST on a complete
checkpoint, and a half-written one is never picked up. Each holds

  model.safetensors  the weights (safetensors: tensors only, no code can hide in it); a LoRA
                     run's adapters alone (--lora_rank: the rest is --init_from's, frozen)
  optimizer.pt       AdamW's state_dict, loaded with weights_only=True (tensors and numbers only):
                     of what trains, so a LoRA run's adapters' alone
  state.json         `CheckpointState`: the progress (the iteration, which is also the data
                     position; elapsed time), the model and weight average as built, the flags,
                     and the identity of the data it was trained on
  rng.json           every rank's RNG states: torch (and CUDA), numpy, python
  average.safetensors  the moving average of the weights (gpt/training/ema.py), if the run keeps one
                     (--ema_decay): what it evaluates and exports

or, written by a run with --shard, `shards/` in place of the weights, optimizer and average
files: every rank's part of them (gpt/training/sharded_checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch

from gpt.config.configs import GPTConfig
from gpt.errors import InputError, first_line
from gpt.models import lora
from gpt.rundir import atomic
from gpt.rundir.layout import RunDir
from gpt.training import faults
from gpt.training.recipe import DEFAULT_EMA_DECAY

MODEL, OPTIMIZER, STATE, RNG = "model.safetensors", "optimizer.pt", "state.json", "rng.json"
FILES = (MODEL, OPTIMIZER, STATE, RNG)  # every checkpoint has these
AVERAGE = "average.safetensors"  # and one of a run with a weight average, this
SHARDS = "shards"  # a sharded checkpoint (--shard) has this folder for the tensors
SHARDED_FILES = (STATE, RNG, f"{SHARDS}/.metadata")  # and these, written last
_STEP_DIR = re.compile(r"^step-(\d+)$")
_RESTART = "pass --resume never to start over"


@dataclass
class TrainState:
    """The progress a checkpoint restores, besides weights, optimizer and RNG states."""

    step: int = 0
    """Iterations done (serialized as `step`, the run directory's word). Also the data position:
    iteration s trains on the windows drawn from (seed, s), and the learning rate is a function
    of s alone."""
    elapsed_s: float = 0.0
    """Training wall time summed over every attempt: what --time_budget counts. It decides only
    when a budgeted run stops, never what an iteration computes, so runs stay reproducible."""
    tokens: int = 0
    """Tokens trained on, over all ranks."""


@dataclass(frozen=True)
class CheckpointState:
    """A checkpoint's `state.json`: what a resumed run continues from and is checked against.

    The trainer makes one per checkpoint, `save` writes it (`to_json`) and `read_state` reads it
    (`from_json`); nothing else spells its keys. A state.json of an older version reads with the
    keys it lacks at the values it implied (`from_json`).
    """

    train: TrainState
    """The progress: iterations, training time, tokens."""
    model: GPTConfig
    """The model as built, its unset flags resolved (gpt/training/recipe.py): a resumed run
    keeps its dropout and spelling, and must have the same shape."""
    ema_decay: float
    """The weight average's decay per iteration, 0 for none: a resumed run keeps it."""
    data: dict[str, Any]
    """`DataMeta.identity()` of the data trained on: resuming on other data is refused."""
    config: dict[str, Any]
    """Every flag of the attempt that wrote it (TrainConfig), compared key by key on resume
    (a changed one is logged), so a flag added or removed since is no error."""
    world_size: int
    """How many processes trained."""

    def to_json(self) -> dict[str, Any]:
        return {
            "train": dataclasses.asdict(self.train),
            "config": self.config,
            "model": dataclasses.asdict(self.model),
            "ema_decay": self.ema_decay,
            "data": self.data,
            "world_size": self.world_size,
        }

    @classmethod
    def from_json(cls, raw: Any, has_average: bool) -> CheckpointState:
        """The state `raw` (a parsed state.json) holds, of a checkpoint with a weight average
        file or not (`has_average`); a ValueError says what is wrong with it.

        Older versions wrote no "spelling" (their embedding was a plain table, 0) and no
        "ema_decay" (their rule: the default decay if the checkpoint has an average, else 0).
        """
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in ("train", "model", "data", "config", "world_size") if k not in raw]
        if missing:
            raise ValueError(f"missing key {missing[0]!r}")
        for key in ("train", "model", "data", "config"):
            if not isinstance(raw[key], dict):
                raise ValueError(f"{key}: not a JSON object")
        train = _typed(TrainState, raw["train"], "train")
        for name in ("step", "tokens"):
            if not _is_int(getattr(train, name)) or getattr(train, name) < 0:
                raise ValueError(f"train.{name} {getattr(train, name)!r}: not an integer >= 0")
        if not isinstance(train.elapsed_s, int | float) or not train.elapsed_s >= 0:
            raise ValueError(f"train.elapsed_s {train.elapsed_s!r}: not a number >= 0")
        model = _typed(GPTConfig, {"spelling": 0, **raw["model"]}, "model")
        ema_decay = raw.get("ema_decay", DEFAULT_EMA_DECAY if has_average else 0.0)
        if not isinstance(ema_decay, int | float) or not 0 <= ema_decay < 1:
            raise ValueError(f"ema_decay {ema_decay!r}: not a number in [0, 1)")
        if not _is_int(raw["world_size"]) or raw["world_size"] < 1:
            raise ValueError(f"world_size {raw['world_size']!r}: not a positive integer")
        return cls(train, model, ema_decay, raw["data"], raw["config"], raw["world_size"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(cls: type, raw: dict[str, Any], key: str) -> Any:
    """`cls` (a dataclass) of the object `raw` at `key`: every field, keys no field has left out
    (a setting removed since is no error; a model's shape is compared field by field)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    if absent := [name for name in fields if name not in raw]:
        raise ValueError(f"{key}: missing key {absent[0]!r}")
    try:
        return cls(**{name: raw[name] for name in fields})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key}: {first_line(e)}") from None


def save(rundir: RunDir, iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         state: CheckpointState, rngs: list[dict[str, Any]], keep_last: int,
         average: torch.nn.Module | None = None) -> Path:
    """Write `ckpt/step-<iteration>/` (with the weight average `average`, if given), point LATEST at
    it, and drop all but the newest `keep_last`."""
    dest = rundir.ckpt_step(iteration)
    what = f"checkpoint step {iteration}"
    with atomic.staged_dir(dest, what=what) as stage:
        _write_weights(model, stage / MODEL)
        if average is not None:
            _write_weights(average, stage / AVERAGE)
        # Into a Python file, not to a path: torch's own file writer reports a full volume as
        # "unexpected pos" and nothing more; Python's write raises the OSError it is.
        with open(stage / OPTIMIZER, "wb") as f:
            torch.save(optimizer.state_dict(), f)
        write_facts(stage, state, rngs)
        faults.checkpoint_staged(iteration)
    publish(rundir, dest, keep_last)
    return dest


def write_facts(stage: Path, state: CheckpointState, rngs: list[dict[str, Any]]) -> None:
    """state.json and rng.json (every rank's RNG states, `rngs` in rank order) into `stage`, a
    checkpoint's staging folder."""
    (stage / STATE).write_text(json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")
    (stage / RNG).write_text(json.dumps({str(r): s for r, s in enumerate(rngs)}) + "\n")


def publish(rundir: RunDir, dest: Path, keep_last: int) -> None:
    """Point LATEST at checkpoint `dest`, now in place, and drop all but the newest
    `keep_last`."""
    atomic.write_text(rundir.latest, dest.name + "\n", what=f"the pointer to {dest.name}")
    prune(rundir, keep_last)

def _write_weights(module: torch.nn.Module, path: Path) -> None:
    """What trains of `module`: a LoRA run's adapters alone (its frozen weights are
    --init_from's, read again on resume), else every weight."""
    if lora.has_adapters(module):
        safetensors.torch.save_file(lora.adapter_weights(module), str(path))
    else:  # save_model, not save_file: the tied embedding and head share one tensor
        safetensors.torch.save_model(module, str(path))


def _read_weights(module: torch.nn.Module, path: Path, device: torch.device) -> None:
    """Load what `_write_weights` wrote into `module`, strictly: RuntimeError or ValueError."""
    if lora.has_adapters(module):
        lora.load_adapters(module, safetensors.torch.load_file(str(path), device=str(device)))
    else:
        safetensors.torch.load_model(module, str(path), strict=True, device=str(device))


def _step_dirs(rundir: RunDir) -> list[tuple[int, Path]]:
    if not rundir.ckpt_dir.is_dir():
        return []
    found = ((_STEP_DIR.match(p.name), p) for p in rundir.ckpt_dir.iterdir() if p.is_dir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


def prune(rundir: RunDir, keep_last: int) -> None:
    """Remove all but the newest `keep_last` checkpoints (never the one LATEST names), and the
    staging directories of writes that were cut off."""
    latest = find_latest(rundir)
    for _, path in _step_dirs(rundir)[:-keep_last]:
        if path != latest:
            shutil.rmtree(path, ignore_errors=True)
    for stale in rundir.ckpt_dir.glob(".step-*.staging"):
        shutil.rmtree(stale, ignore_errors=True)


def clear(rundir: RunDir) -> None:
    """Remove every checkpoint (a fresh start)."""
    shutil.rmtree(rundir.ckpt_dir, ignore_errors=True)


def find_latest(rundir: RunDir) -> Path | None:
    """The checkpoint LATEST names, or None if there is none; a broken one is an InputError."""
    if not rundir.latest.is_file():
        return None
    name = rundir.latest.read_text().strip()
    if not _STEP_DIR.match(name):
        raise InputError(f"{rundir.latest}: does not name a checkpoint ({name[:40]!r})")
    path = rundir.ckpt_dir / name
    missing = [f for f in (SHARDED_FILES if is_sharded(path) else FILES)
               if not (path / f).is_file()]
    if missing:
        raise InputError(
            f"{rundir.latest} names {name}, which lacks {', '.join(missing)}; "
            f"remove {rundir.ckpt_dir} or {_RESTART}"
        )
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: truncated or corrupt checkpoint file ({e})") from None


def read_state(path: Path) -> CheckpointState:
    """The state.json of checkpoint `path`; a bad one is a one-line InputError naming it."""
    try:
        return CheckpointState.from_json(_read_json(path / STATE), has_average(path))
    except ValueError as e:
        raise InputError(f"{path / STATE}: not a checkpoint state ({e}); {_RESTART}") from None


def read_rngs(path: Path) -> dict[str, Any]:
    """The rng.json of checkpoint `path`: each rank's RNG states, by rank."""
    return _read_json(path / RNG)


def load_weights(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, average: torch.nn.Module | None = None) -> None:
    """Load model and optimizer state (and the weight average into `average`, if given) from
    checkpoint `path`, refusing anything but tensors."""
    if average is not None and not has_average(path):
        raise InputError(no_average(path))
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
            _read_weights(module, path / name, device)
        except (safetensors.SafetensorError, RuntimeError, OSError, ValueError) as e:
            raise InputError(f"{path / name}: truncated or corrupt checkpoint file "
                             f"({first_line(e)})") from None
    try:
        optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError) as e:
        raise InputError(
            f"{path / OPTIMIZER}: does not fit this model ({first_line(e)})"
        ) from None


def no_average(path: Path) -> str:
    """Why checkpoint `path`, which holds no weight average, cannot resume a run that keeps
    one."""
    return (f"{path}: has no weight average: it was trained without one; pass --ema_decay 0 "
            "to continue it, or --resume never to start over")


def is_sharded(path: Path) -> bool:
    """Whether checkpoint `path` was written sharded (--shard): `shards/` in place of the
    weights, optimizer and average files."""
    return (path / SHARDS).is_dir()


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
