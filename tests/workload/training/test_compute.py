"""Where --fused_loss may run (gpt/training/compute.py): CUDA, or Triton's CPU interpreter; and
the flags it cannot go with (gpt/config/configs.py)."""

from __future__ import annotations

import importlib.util

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


def test_triton_s_interpreter_runs_it_on_a_cpu(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if importlib.util.find_spec("triton") is None:
        with pytest.raises(InputError, match="Triton is not installed"):
            check_fused_loss(True, CPU)
    else:
        check_fused_loss(True, CPU)


def test_the_fused_loss_is_a_chunked_loss() -> None:
    assert TrainConfig(fused_loss=True).chunked_loss is None  # unset: the fused loss chunks
    with pytest.raises(ValueError, match=r"^--fused_loss true: computes the chunked loss; leave "
                                         r"--chunked_loss unset or true$"):
        TrainConfig(fused_loss=True, chunked_loss=False)
