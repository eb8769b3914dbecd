"""How many cores this process may keep busy: the CPUs it may run on, capped by its container's
CPU limit. `os.cpu_count()` counts the node's cores: a pod limited to 2 CPUs on a 64-core node
that starts 64 threads has the kernel throttle them all (CFS quota) for most of each period.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def usable_cores(cgroup: Path = CGROUP) -> int:
    """The CPUs in this process's affinity mask, at most its CPU quota rounded up (a limit of
    1.5 CPUs keeps two threads busy part of the time), and at least one."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPU limit of the cgroup mounted at `cgroup`, in CPUs (None: unlimited or unknown).
    A container sees its own cgroup there (the kubelet's `resources.limits.cpu`): cgroup v2's
    `cpu.max` ("QUOTA PERIOD", or "max PERIOD"), or v1's `cpu.cfs_quota_us` (-1: none) over
    `cpu.cfs_period_us`."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
