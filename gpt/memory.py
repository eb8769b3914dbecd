"""How much memory this process may use on the CPU: its container's memory limit, else the
machine's RAM. A pod's `resources.limits.memory` is its cgroup's limit, enforced by the kernel's
OOM killer, and far below the node's RAM that /proc/meminfo shows; gpt/cores.py reads the CPU
limit beside it the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpt.cores import CGROUP

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number, not as "max".
_V1_UNLIMITED = 1 << 62


def memory_limit(cgroup: Path = CGROUP) -> int | None:
    """The memory limit of the cgroup mounted at `cgroup`, in bytes (None: unlimited or
    unknown): cgroup v2's `memory.max` ("max": none), or v1's `memory/memory.limit_in_bytes`."""
    try:
        raw = (cgroup / "memory.max").read_text().strip()
        return None if raw == "max" else int(raw)
    except (OSError, ValueError):
        pass
    try:
        limit = int((cgroup / "memory" / "memory.limit_in_bytes").read_text())
    except (OSError, ValueError):
        return None
    return limit if 0 < limit < _V1_UNLIMITED else None


def physical_memory() -> int:
    """The machine's RAM in bytes (0 where it is not known)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def usable_memory(cgroup: Path = CGROUP) -> int:
    """What this process may use: the container's limit where there is one below the machine's
    RAM, else the RAM (0: not known)."""
    ram, limit = physical_memory(), memory_limit(cgroup)
    return min(limit, ram) if limit and ram else limit or ram
