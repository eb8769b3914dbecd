"""usable_cores: the affinity mask, capped by the container's CPU limit as cgroups state it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpt.cores import cpu_quota, usable_cores

CORES = len(os.sched_getaffinity(0))


def v2(tmp_path: Path, cpu_max: str) -> Path:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    return tmp_path


def v1(tmp_path: Path, quota: int, period: int = 100000) -> Path:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return tmp_path


@pytest.mark.parametrize(("cpu_max", "cpus"), [
    ("max 100000", None), ("200000 100000", 2.0), ("150000 100000", 1.5), ("50000 100000", 0.5),
])  # fmt: skip
def test_cgroup_v2_cpu_max(tmp_path: Path, cpu_max: str, cpus: float | None) -> None:
    assert cpu_quota(v2(tmp_path, cpu_max)) == cpus


@pytest.mark.parametrize(("quota", "cpus"), [(-1, None), (300000, 3.0), (25000, 0.25)])
def test_cgroup_v1_cfs_quota(tmp_path: Path, quota: int, cpus: float | None) -> None:
    assert cpu_quota(v1(tmp_path, quota)) == cpus


def test_no_cgroup_files_is_no_limit(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path) == CORES


def test_a_limit_caps_the_cores_rounded_up_and_never_below_one(tmp_path: Path) -> None:
    assert usable_cores(v2(tmp_path, "max 100000")) == CORES
    assert usable_cores(v2(tmp_path, "50000 100000")) == 1  # half a CPU: still one thread
    assert usable_cores(v2(tmp_path, "100001 100000")) == min(CORES, 2)
    assert usable_cores(v2(tmp_path, f"{1000 * 100000} 100000")) == CORES  # above the mask

