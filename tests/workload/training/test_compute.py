"""Where --fused_loss may run (gpt/training/compute.py): CUDA, or Triton's CPU interpreter; and
the flags it cannot go with (gpt/config/configs.py)."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
import torch

from gpt.config.configs import TrainConfig
from gpt.errors import InputError
from gpt.training.compute import check_fused_loss

CPU = torch.device("cpu")


def test_the_fused_loss_is_refused_on_a_cpu_in_one_line(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    check_fused_loss(False, CPU)  # the default: nothing to refuse
    with pytest.raises(InputError, match=r"^--fused_loss true: a Triton kernel, for CUDA; this "
                                         r"run is on cpu \(leave --fused_loss false\)$"):
        check_fused_loss(True, CPU)


def test_triton_s_interpreter_runs_it_on_a_cpu_where_triton_is_installed(monkeypatch) -> None:
    """Accepted under TRITON_INTERPRET=1, once gpt.models.fused_loss (Triton) imports: here
    stood in for, so this test neither imports Triton nor depends on it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "gpt.models.fused_loss", ModuleType("gpt.models.fused_loss"))
    check_fused_loss(True, CPU)
    monkeypatch.setitem(sys.modules, "gpt.models.fused_loss", None)  # as if Triton were absent
    with pytest.raises(InputError, match=r"^--fused_loss true: Triton is not installed here"):
        check_fused_loss(True, CPU)


def test_the_fused_loss_is_a_chunked_loss() -> None:
    assert TrainConfig(fused_loss=True).chunked_loss is None  # unset: the fused loss chunks
    with pytest.raises(ValueError, match=r"^--fused_loss true: computes the chunked loss; leave "
                                         r"--chunked_loss unset or true$"):
        TrainConfig(fused_loss=True, chunked_loss=False)
