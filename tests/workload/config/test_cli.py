"""The config-to-CLI bridge and the `python -m gpt` dispatcher."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest

from gpt.config.cli import build_parser, field_docs, parse_config
from gpt.config.configs import RunConfig


@dataclass
class Example(RunConfig):
    steps: int = 10
    """How many steps to take."""
    rate: float = 0.5
    """A rate in [0, 1]."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    loud: bool = False
    """Say more."""
    names: list[str] = field(default_factory=list)
    """Repeatable name."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.rate <= 1:
            raise ValueError(f"--rate {self.rate}: must be in [0, 1]")


def test_field_docstrings_become_help_including_inherited() -> None:
    docs = field_docs(Example)
    assert docs["steps"] == "How many steps to take."
    assert docs["root"].startswith("Directory that holds one sub-directory per run")
    text = build_parser(Example, "prog", "desc").format_help()
    for flag in ("--root", "--run", "--steps", "--rate", "--mode", "--loud", "--names"):
        assert flag in text


def test_parse_types_defaults_and_repeatable() -> None:
    cfg = parse_config(
        Example, ["--steps", "3", "--loud", "true", "--names", "x", "--names", "y"], "p", "d"
    )
    assert (cfg.steps, cfg.rate, cfg.mode, cfg.loud, cfg.names) == (3, 0.5, "a", True, ["x", "y"])
    assert parse_config(Example, [], "p", "d").names == []


def test_validation_error_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--rate"):
        parse_config(Example, ["--rate", "2"], "p", "d")
    with pytest.raises(Exception, match="--run"):
        parse_config(Example, ["--run", "../escape"], "p", "d")


def run_gpt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpt", *args], capture_output=True, text=True)


@pytest.mark.process
def test_gpt_help_lists_stages_and_unknown_stage_exits_2() -> None:
    out = run_gpt("--help")
    assert out.returncode == 0 and "load-corpus" in out.stdout
    bad = run_gpt("nonsense")
    assert bad.returncode == 2 and "unknown stage 'nonsense'" in bad.stderr
    # torchrun -m gpt -- train-gpt ...: a leading "--" some Pythons' argparse passes on is skipped
    assert run_gpt("--", "--help").returncode == 0


def test_idle_timeout_zero_waits_forever_and_a_negative_one_is_refused() -> None:
    from gpt.config.configs import PromptConfig

    assert PromptConfig(idle_timeout=0).idle_timeout == 0  # 0: no limit, as top_k's 0
    with pytest.raises(ValueError, match=r"--idle_timeout -1: must be >= 0 seconds"):
        PromptConfig(idle_timeout=-1)
