"""One process or many: the same training code under `python -m gpt` and under `torchrun`.

torchrun (and the Kubeflow Trainer, which runs torchrun on every node) tells each process who it
is through RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE. Without them this is a world of one
and no process group is created.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from gpt.cores import usable_cores
from gpt.errors import InputError


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    local_size: int = 1
    device: torch.device = torch.device("cpu")
    host_group: Any = None
    """A gloo group for the host-side decisions (`agree`) when the default group is NCCL; None:
    the default group is gloo already."""

    @property
    def is_main(self) -> bool:
        """Rank 0 writes every file; the other ranks only compute."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over all ranks."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def from_main(self, value: float) -> float:
        """Rank 0's value on every rank (for decisions all ranks must take together)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        return t.item()

    def agree(self, flags: list[bool]) -> list[bool]:
        """Each flag True on every rank if it is True on any rank: for decisions all ranks take
        together at the same iteration. Host tensors over gloo, so it never waits for the device."""
        if not self.distributed:
            return flags
        t = torch.tensor(flags, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return [bool(v) for v in t.tolist()]

    def barrier(self) -> None:
        """Wait until every rank is here (on the host group: no device sync)."""
        if self.distributed:
            dist.barrier(group=self.host_group)

    def gather_json(self, obj: Any) -> list[Any]:
        """Every rank's JSON-able `obj`, in rank order. Sent as JSON text, not pickles
        (unlike `all_gather_object`), so nothing a peer sends is ever unpickled."""
        if not self.distributed:
            return [obj]
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        data = data.to(self.device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        dist.all_gather(sizes, torch.tensor([len(data)], device=self.device))
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[: len(data)] = data
        bufs = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(bufs, padded)
        texts = (b[: int(n)].cpu().numpy().tobytes() for b, n in zip(bufs, sizes, strict=True))
        return [json.loads(t) for t in texts]


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def setup(device: str) -> World:
    """Pick the device, start the process group under torchrun, and size the CPU thread pool."""
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_size = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device is available (use --device cpu)")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and newer
    else:
        dev = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            # Ranks on one machine share its cores (as many as its CPU limit lets it keep busy);
            # more threads than cores runs slower.
            threads = max(1, usable_cores() // local_size)
            # Only where that changes the count: set_num_threads also stops MKL from running a
            # small matmul on fewer threads than the pool has (mkl_set_dynamic(false)).
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
    if world_size > 1:
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo",
            store=_attempt_store(rank, world_size),
            rank=rank,
            world_size=world_size,
            device_id=dev if dev.type == "cuda" else None,
        )
        if dev.type == "cuda":
            host_group = dist.new_group(backend="gloo")
            return World(rank, local_rank, world_size, local_size, dev, host_group)
    return World(rank, local_rank, world_size, local_size, dev)


def _attempt_store(rank: int, world_size: int) -> dist.Store:
    """torchrun's key-value store, with this attempt's keys apart from earlier attempts'.

    The workers share the torchrun agent's store, which outlives a restart (`--max-restarts`):
    measured with torch 2.13 and gloo, restarted ranks then read the dead attempt's peer
    addresses and fail ("connectFullMesh failed ... Connection refused"). Prefixing the keys
    with the restart count keeps each attempt's rendezvous its own.
    """
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not agent_store,  # without an agent store, rank 0 hosts it
        timeout=default_pg_timeout,
    )
    return dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def teardown(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
