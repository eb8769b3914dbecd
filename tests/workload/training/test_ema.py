"""The weight average train-gpt evaluates and exports (gpt/training/ema.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.runs import TINY_MODEL, assert_same_weights, train, write_data

from gpt.config.configs import GPTConfig, TrainConfig
from gpt.models.export import load_export
from gpt.models.model import GPT
from gpt.rundir.layout import RunDir
from gpt.training import checkpoint_files
from gpt.training.ema import WeightAverage
from gpt.training.recipe import DEFAULT_EMA_DECAY, finish


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY_MODEL, vocab_size=40))


def test_the_first_steps_are_averaged_uniformly_then_exponentially() -> None:
    model = _model()
    average = WeightAverage(model, decay=0.75)  # uniform over 1 / (1 - 0.75) = 4 steps
    seen = []
    for step in range(1, 8):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        seen.append([p.detach().clone() for p in model.parameters()])
        average.update(model, step)
        if step <= 4:  # no trace of the initial weights: the mean of the steps so far
            want = [torch.stack(ws).mean(0) for ws in zip(*seen, strict=True)]
        else:
            want = [0.75 * w + 0.25 * p for w, p in zip(want, seen[-1], strict=True)]
        for got, w in zip(average.model.parameters(), want, strict=True):
            torch.testing.assert_close(got, w)
    assert average.decay_at(1) == 0 and average.decay_at(100) == 0.75


def test_the_average_keeps_the_tied_embedding_tied_and_trains_nothing() -> None:
    model = _model()
    average = WeightAverage(model, decay=0.9)
    assert average.model.lm_head.weight is average.model.transformer.wte.weight
    assert average.model.lm_head.weight is not model.lm_head.weight
    assert not any(p.requires_grad for p in average.model.parameters())
    assert not average.model.training


def _decay(cfg: TrainConfig, train_tokens: int) -> float:
    """The decay a new run with flags `cfg` on `train_tokens` training tokens averages with."""
    return finish(cfg, 64, train_tokens).config.ema_decay


def test_unset_the_average_is_on_for_a_long_run_that_passes_over_its_data_often() -> None:
    cfg = TrainConfig()  # 600 steps of 12 x 64 tokens: 460,800 tokens
    assert _decay(cfg, 25_648) == DEFAULT_EMA_DECAY  # the default corpus: 18 times over
    assert _decay(cfg, 460_800 // 4) == DEFAULT_EMA_DECAY
    assert _decay(cfg, 460_800 // 4 + 1) == 0  # the plays: a third of one pass
    assert _decay(cfg, 1_418_109) == 0
    assert _decay(TrainConfig(max_iters=599), 100) == 0  # too short: it would lag
    assert _decay(TrainConfig(ema_decay=0.9), 10**9) == 0.9
    assert _decay(TrainConfig(ema_decay=0), 100) == 0
    with pytest.raises(ValueError, match=r"^--ema_decay 1"):
        TrainConfig(ema_decay=1.0)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_0_1_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(_model(), decay)


def test_the_run_exports_and_checkpoints_the_average(root: Path) -> None:
    run = write_data(root, "r")
    # A plain embedding table, so the export's tensor is the average's own (a spelled one's
    # export is its sum: tests/workload/models/test_spelling.py).
    assert train(root, "r", "--max_iters", "20", "--ckpt_interval", "10", "--ema_decay", "0.9",
                 "--spelling", "0") == 0
    ckpt = RunDir.of(root, "r").ckpt_step(20)
    raw = load_file(ckpt / checkpoint_files.MODEL)
    average = load_file(ckpt / checkpoint_files.AVERAGE)
    assert checkpoint_files.evaluated_weights(ckpt) == ckpt / checkpoint_files.AVERAGE
    assert not torch.equal(raw["lm_head.weight"], average["lm_head.weight"])
    model, _ = load_export(run.model_dir)
    vocab = model.config.vocab_size
    torch.testing.assert_close(model.lm_head.weight[:vocab], average["lm_head.weight"][:vocab],
                               rtol=0, atol=0)


def test_a_run_resumed_without_ema_decay_keeps_the_decay_it_started_with(root: Path) -> None:
    flags = ("--max_iters", "20", "--ckpt_interval", "10")
    for run in ("whole", "cut"):
        write_data(root, run)
        assert train(root, run, *flags, "--ema_decay", "0.9") == 0
    # What a kill after step 10's checkpoint leaves: step-10, LATEST naming it.
    cut = RunDir.of(root, "cut")
    shutil.rmtree(cut.ckpt_step(20))
    cut.latest.write_text("step-10\n")
    assert train(root, "cut", *flags) == 0  # --ema_decay left out, as a plain rerun does
    whole = load_file(RunDir.of(root, "whole").ckpt_step(20) / checkpoint_files.AVERAGE)
    resumed = load_file(cut.ckpt_step(20) / checkpoint_files.AVERAGE)
    assert_same_weights(resumed, whole, "the resumed average")


def test_without_an_average_the_run_writes_none_and_resuming_needs_it_off(root: Path,
                                                                          capsys) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "10", "--ckpt_interval", "5", "--ema_decay", "0",
                 "--spelling", "0") == 0  # a plain table: the export's tensor is the raw one
    ckpt = RunDir.of(root, "r").ckpt_step(10)
    assert not (ckpt / checkpoint_files.AVERAGE).exists()
    assert checkpoint_files.evaluated_weights(ckpt) == ckpt / checkpoint_files.MODEL
    model, _ = load_export(run.model_dir)
    raw = load_file(ckpt / checkpoint_files.MODEL)
    assert torch.equal(model.transformer.wte.weight[:10], raw["lm_head.weight"][:10])
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "20", "--ema_decay", "0.9") != 0
    assert "--ema_decay 0" in capsys.readouterr().err
