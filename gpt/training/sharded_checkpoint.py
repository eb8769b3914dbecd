"""Sharded checkpoints (--shard): the weights, AdamW's state and the weight average written by
every rank at once with `torch.distributed.checkpoint` (DCP), and read back by any number of
ranks, sharded or not; and a whole checkpoint read into a sharded model (`load_whole`).

A sharded checkpoint is `ckpt/step-<N>/` with state.json and rng.json as every checkpoint
(gpt/training/checkpoint_files.py), and instead of model.safetensors, optimizer.pt and
average.safetensors one folder:

  shards/            DCP's: `__<rank>_0.distcp`, each rank's part of every tensor, and
                     `.metadata`, where each part lies (written by rank 0 once all are written)

It is as atomic as the others: rank 0 makes the staging folder, every rank writes its part into
it, rank 0 writes the rest and renames it into place once DCP has told it every rank is done,
then rewrites LATEST; a kill at any moment leaves LATEST on the previous checkpoint and the
staging folder for the next start to remove.

DCP pickles its `.metadata`; it is read here by an unpickler that builds DCP's own metadata
classes and nothing else (`_MetadataUnpickler`), and every entry is a tensor, which DCP reads
with `torch.load(weights_only=True)`: as with optimizer.pt, a checkpoint that holds Python
objects is refused and nothing in it runs. (The optimizer's hyper-parameters, Python numbers,
are not saved: a resumed run takes them from its flags.)
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from gpt.distributed.world import World
from gpt.errors import DiskFull, InputError, first_line
from gpt.rundir import atomic
from gpt.rundir.layout import RunDir
from gpt.training import checkpoint_files, faults
from gpt.training.checkpoint_files import SHARDS, CheckpointState

# What a `.metadata` of DCP's filesystem writer holds (torch 2.13), and all it may: DCP's metadata
# classes, torch's sizes, dtypes and layouts, the path it was written to.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}  # fmt: skip


class _Refused(pickle.UnpicklingError):
    """A `.metadata` that holds more than DCP's metadata."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds `_METADATA_CLASSES` and torch's dtypes, and refuses anything else by name."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"it would call {module}.{name}")


class _Reader(FileSystemReader):
    """DCP's filesystem reader of folder `path`, its metadata read by `_MetadataUnpickler` when
    it is made (before DCP, which would log a failure and raise another)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        with open(path / ".metadata", "rb") as f:
            self.metadata = _MetadataUnpickler(f).load()
        if not isinstance(self.metadata, Metadata):
            raise _Refused(f"not DCP's metadata: a {type(self.metadata).__name__}")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self.metadata.storage_meta = self.metadata.storage_meta or StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


def _dcp(call: Callable[[], Any]) -> Any:
    """`call()`, a DCP save or load. DCP gathers the ranks' failures into one
    CheckpointException, a BaseException no `except Exception` catches: the first rank's is
    raised as itself (a full volume then a DiskFull, gpt/rundir/atomic.py, as elsewhere). A
    single process is no mistake here: DCP's warning that it assumes one is not passed on."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            return call()
    except CheckpointException as e:
        raise next(iter(e.failures.values()))[0] from None


def _tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             average: torch.nn.Module | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What a sharded checkpoint holds, as this rank sees it (its shards, or whole tensors in a
    model that is not sharded), keyed by parameter name; and the optimizer's parameter groups,
    which it does not hold."""
    weights, optimizer_state = get_state_dict(model, optimizer)
    tensors = {"model": weights, "optimizer": optimizer_state["state"]}
    if average is not None:
        tensors["average"] = get_model_state_dict(average)
    return tensors, optimizer_state["param_groups"]


def _largest_bytes(tensors: dict[str, Any]) -> int:
    """The bytes of the largest tensor (this rank's part of it) in nested dicts `tensors`."""
    largest = 0
    for value in tensors.values():
        if isinstance(value, dict):
            largest = max(largest, _largest_bytes(value))
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            largest = max(largest, local.numel() * local.element_size())
    return largest


def save(rundir: RunDir, world: World, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         average: torch.nn.Module | None, state: CheckpointState, rngs: list[dict[str, Any]],
         keep_last: int) -> Path:
    """Write `ckpt/step-<N>/` of `state` (N its iteration), every rank its shards; rank 0
    publishes it (LATEST) and prunes. Every rank must call it; all return once it is published."""
    iteration = state.train.step
    dest = rundir.ckpt_step(iteration)
    what = f"checkpoint step {iteration}"
    tensors, _ = _tensors(model, optimizer, average)
    staging = atomic.staged_dir(dest, what=what) if world.is_main else contextlib.nullcontext()
    with staging as stage:
        stage = Path(world.gather_json(str(stage))[0])  # rank 0's staging folder, to every rank
        with atomic.writing(dest / SHARDS, what):
            try:  # returns on rank 0 once every rank's shards are written, and .metadata after
                _dcp(lambda: dcp.save(tensors, storage_writer=FileSystemWriter(stage / SHARDS),
                                      no_dist=not world.distributed))
            except RuntimeError as e:
                # DCP writes each tensor with torch.save, whose writer reports a full volume as
                # "unexpected pos" and drops the OSError (checkpoint_files.save works around it
                # with a Python file, which DCP's writer does not give it): the volume tells.
                if shutil.disk_usage(stage).free < _largest_bytes(tensors):
                    raise DiskFull(dest / SHARDS, what) from e
                raise
        if world.is_main:
            checkpoint_files.write_facts(stage, state, rngs)
            faults.checkpoint_staged(iteration)
    if world.is_main:
        checkpoint_files.publish(rundir, dest, keep_last)
    world.barrier()  # no rank goes on (or stops) before the checkpoint is in place
    return dest


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         average: torch.nn.Module | None, saved: CheckpointState) -> None:
    """Load sharded checkpoint `path` (its state `saved`) into `model`, `optimizer` and the
    weight average `average` (if given), whatever the number of ranks that wrote it and this
    run's (DCP reads each rank's share from the shards that hold it). Every rank must call it."""
    if average is not None and not saved.ema_decay:
        raise InputError(checkpoint_files.no_average(path))
    tensors, param_groups = _tensors(model, optimizer, average)
    try:
        reader = _Reader(path / SHARDS)
        _dcp(lambda: dcp.load(tensors, storage_reader=reader, no_dist=not dist.is_initialized()))
    except _Refused as e:
        raise InputError(f"{path / SHARDS}: refused, it holds Python objects, not only tensors "
                         f"({first_line(e)})") from None
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError, KeyError,
            AssertionError) as e:
        raise InputError(f"{path / SHARDS}: truncated or corrupt, or not of this model "
                         f"({first_line(e)})") from None
    set_state_dict(model, optimizer, model_state_dict=tensors["model"],
                   optim_state_dict={"state": tensors["optimizer"], "param_groups": param_groups})
    if average is not None:
        set_model_state_dict(average, tensors["average"])


def load_whole(whole: tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module | None] | None,
               model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               average: torch.nn.Module | None) -> None:  # fmt: skip
    """Load a whole checkpoint (written without --shard) into the sharded `model`, `optimizer`
    and `average`: `whole`, on rank 0 (None on the others), is the plain model, its optimizer and
    average with the checkpoint loaded (checkpoint_files.load_weights, its checks and refusals
    included); rank 0 sends each tensor to every rank, which keeps its shards. Every rank must
    call it."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    weights: dict[str, Any] = {}
    optimizer_state: dict[str, Any] = {}
    average_weights: dict[str, Any] = {}
    if whole is not None:
        plain, plain_optimizer, plain_average = whole
        # Keyed by parameter name, as the sharded model's are, not by position as a plain
        # optimizer's state_dict is.
        weights, optimizer_state = get_state_dict(plain, plain_optimizer)
        if plain_average is not None:
            average_weights = get_model_state_dict(plain_average)
    # One call each: set_state_dict takes the other ranks' empty model weights for none to load.
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
    set_model_state_dict(model, weights, options=options)
    if average is not None:
        set_model_state_dict(average, average_weights, options=options)
