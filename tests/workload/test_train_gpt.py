"""train-gpt in one process: it learns, writes its outputs, resumes exactly, refuses bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, load_model
from support.runs import (
    DEFAULT_FLAGS,
    ONE_THREAD,
    TINY,
    TINY_MODEL,
    assert_same_weights,
    default_flags_run,
    in_process,
    model_weights,
    records,
    train,
    write_data,
)

from gpt.__main__ import main as gpt_main
from gpt.config.cli import build_parser
from gpt.config.configs import TrainConfig
from gpt.cores import usable_cores
from gpt.distributed import world
from gpt.distributed.world import World, setup
from gpt.errors import InputError
from gpt.models import loss as chunked
from gpt.models.export import load_export
from gpt.models.model import GPT, GPTConfig
from gpt.models.spelling import spell, spelling_of
from gpt.rundir.layout import DataMeta, RunDir
from gpt.tokenizer.kinds import load_tokenizer
from gpt.training import checkpoint_files
from gpt.training import trainer as trainer_module
from gpt.training.batches import Batches, count_ids, eval_offsets
from gpt.training.divergence import NonFiniteLoss
from gpt.training.optimizer import lr_at
from gpt.training.recipe import DROPOUT_REPEATED, FINETUNE_LR, LORA_LR, finish
from gpt.training.trainer import Trainer


def test_short_run_lowers_the_loss_and_writes_every_output(root: Path, capsys) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "30", "--eval_interval", "10",
                 "--ckpt_interval", "10", "--keep_last", "2") == 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "ETA" in out and "bits/byte" in out

    recs = records(run)
    assert [r["step"] for r in recs] == list(range(1, 31))
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    assert len(vals) == 3
    vocab = json.loads(run.meta_json.read_text())["vocab_size"]
    assert vals[-1] < vals[0] < math.log(vocab)  # learned something, beyond the uniform guess
    final = recs[-1]
    meta = json.loads(run.meta_json.read_text())
    expected_bpb = final["val_loss"] * meta["val_tokens"] / (meta["val_bytes"] * math.log(2))
    assert final["val_bpb"] == pytest.approx(expected_bpb)

    model, tokenizer = load_export(run.model_dir)
    assert tokenizer.to_json() == load_tokenizer(run.tokenizer_json).to_json()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    # the export is the final weights: the same as the last checkpoint's, but for padding rows,
    # its spelled embedding written out as one table
    ckpt = load_file(run.ckpt_step(30) / checkpoint_files.MODEL)
    assert ckpt["lm_head.weight"].size(0) % 64 == 0 and ckpt["lm_head.weight"].size(0) > vocab
    assert model.lm_head.weight.size(0) == ckpt["lm_head.weight"].size(0)
    saved = json.loads((run.ckpt_step(30) / checkpoint_files.STATE).read_text())["model"]
    trained = GPT(GPTConfig(**saved), spelling_of(tokenizer, saved["spelling"]))
    load_model(trained, run.ckpt_step(30) / checkpoint_files.MODEL)
    torch.testing.assert_close(model.lm_head.weight[:vocab], trained.embedding()[:vocab])

    assert run.latest.read_text().strip() == "step-30"
    assert sorted(p.name for p in run.ckpt_dir.iterdir()) == ["LATEST", "step-20", "step-30"]
    assert run.loss_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = run.report_md.read_text()
    assert "bits per byte" in report and "loss.png" in report and "--max_iters 30" in report


@pytest.mark.parametrize("extra", [[], ["--chunked_loss", "true", "--grad_accum", "2"]])
def test_exact_resume_equals_a_straight_run(root: Path, extra: list[str]) -> None:
    """20 steps straight == 10 steps, stop, resume to 20: the same per-step losses and weights.

    Dropout is on, so the resumed run must also restore the RNG states exactly. Also with what a
    GPU run takes by default, the chunked loss, and the spelled table shared by micro-steps.
    """
    flags = ["--max_iters", "20", "--ckpt_interval", "10", "--keep_last", "5",
             "--eval_interval", "5", "--dropout", "0.1", "--ema_decay", "0.9", *extra]
    straight = write_data(root, "straight")
    assert train(root, "straight", *flags) == 0
    # "stop after 10": the state a run killed right after checkpoint step-10 leaves behind
    resumed = root / "resumed"
    shutil.copytree(straight.path, resumed)
    shutil.rmtree(resumed / "ckpt" / "step-20")
    shutil.rmtree(resumed / "model")
    (resumed / "ckpt" / "LATEST").write_text("step-10\n")
    assert train(root, "resumed", *flags) == 0

    a, b = records(straight), records(write_data(root, "resumed"))
    assert [r["step"] for r in b] == list(range(1, 21))  # steps after 10 logged once, not twice
    losses = [[(r["loss"], r.get("val_loss")) for r in recs] for recs in (a, b)]
    assert losses[0] == losses[1]
    # the weight average resumes too
    for weights in (checkpoint_files.MODEL, checkpoint_files.AVERAGE):
        wa = load_file(straight.ckpt_step(20) / weights)
        wb = load_file(resumed / "ckpt" / "step-20" / weights)
        assert_same_weights(wb, wa, weights)


def test_resume_modes(root: Path, capsys) -> None:
    write_data(root, "r")
    assert train(root, "r", "--max_iters", "6", "--resume", "require") == 2
    assert "--resume require: no checkpoint" in capsys.readouterr().err

    assert train(root, "r", "--max_iters", "6", "--warmup_iters", "2") == 0
    capsys.readouterr()
    # auto: a longer run continues from the end of the last one
    assert train(root, "r", "--max_iters", "9", "--warmup_iters", "2") == 0
    out = capsys.readouterr().out
    assert "resumed from step-6" in out and "max_iters 6 -> 9" in out
    assert [r["step"] for r in records(RunDir.of(root, "r"))] == list(range(1, 10))
    # a restart of a finished run trains nothing and re-exports
    assert train(root, "r", "--max_iters", "9", "--warmup_iters", "2") == 0
    assert "resumed from step-9" in capsys.readouterr().out
    # never: starts over and removes the old checkpoints
    assert train(root, "r", "--max_iters", "4", "--warmup_iters", "2", "--resume", "never",
                 "--keep_last", "5", "--ckpt_interval", "2") == 0
    run = RunDir.of(root, "r")
    assert sorted(p.name for p in run.ckpt_dir.glob("step-*")) == ["step-2", "step-4"]
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4]


def test_resume_refuses_a_different_model_or_data(root: Path, capsys) -> None:
    write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "8", "--n_embd", "64") == 2
    err = capsys.readouterr().err
    assert "different model" in err and "n_embd 32 -> 64" in err and err.count("\n") == 1
    write_data(root, "r", text="A different play altogether.\n" * 80)
    assert train(root, "r", "--max_iters", "8") == 2
    err = capsys.readouterr().err
    assert "different data" in err and "corpus_sha256" in err and err.count("\n") == 1


def test_non_finite_loss_stops_with_the_weights_of_the_last_finite_iteration(
        root: Path, monkeypatch) -> None:
    """The verdict is read only where the trainer syncs anyway (every log_interval here), so
    training runs on to iteration 9; but it names step 8, and nothing after 7 is in the weights,
    the optimizer, the metrics or a checkpoint."""
    cfg = TrainConfig(root=str(root), run="r", **TINY_MODEL,
                      batch_size=8, warmup_iters=2, max_iters=20, ckpt_interval=5,
                      keep_last=10, time_budget=0, eval_iters=2, log_interval=3, device="cpu")
    write_data(root, "r")
    write_data(root, "clean")
    clean = Trainer(dataclasses.replace(cfg, run="clean"), World())
    for iteration in range(7):
        clean._train_iteration(lr_at(clean.cfg, iteration))
        clean.state.step += 1

    trainer = Trainer(cfg, World())
    forward, calls = GPT.forward, []

    def poisoned(self, idx, targets=None, cache=None, embedding=None):
        logits, loss = forward(self, idx, targets, cache, embedding)
        calls.append(1)
        return logits, (loss * float("nan") if len(calls) == 8 and targets is not None else loss)

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(NonFiniteLoss, match="step 8: loss nan.*nothing after step 7 was saved"):
        trainer.fit()
    assert trainer.state.step == 9
    for (name, got), want in zip(trainer.model.state_dict().items(),
                                 clean.model.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    for got, want in zip(trainer.optimizer.state.values(), clean.optimizer.state.values(),
                         strict=True):
        assert all(torch.equal(got[k], want[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    run = cfg.rundir
    assert run.latest.read_text().strip() == "step-5"
    assert [p.name for p in run.ckpt_dir.glob("step-*")] == ["step-5"]
    assert max(r["step"] for r in records(run)) == 6


class _PerMicroBatch:
    """What the trainer did before IterationEmbedding: no table given, so each forward builds it."""

    def __init__(self, model: GPT) -> None:
        pass

    def for_micro_batch(self, last: bool) -> None:
        return None


def _iterations(cfg: TrainConfig, iterations: int, monkeypatch, per_micro_batch: bool):
    """`iterations` iterations of a new trainer; its model and how often it built the table."""
    builds = []
    embedding = GPT.embedding
    with monkeypatch.context() as patch:
        patch.setattr(GPT, "embedding", lambda self: builds.append(1) or embedding(self))
        if per_micro_batch:
            patch.setattr(trainer_module, "IterationEmbedding", _PerMicroBatch)
        trainer = Trainer(cfg, World())
        for iteration in range(iterations):
            trainer._train_iteration(lr_at(trainer.cfg, iteration))
            trainer.state.step += 1
    return trainer.model, len(builds)


def test_a_spelled_table_is_built_once_per_iteration_and_trains_as_one_built_per_micro_batch(
        root: Path, monkeypatch) -> None:
    """Four micro-batches build the spelled table once (not four times) and train bit-identical
    weights over three iterations. (With characters each n-gram is one token's, so the spelling's
    backward of the summed gradient adds what the four backwards did, in the same order; for
    n-grams that tokens share see
    test_the_table_of_an_iteration_gets_every_micro_batch_gradient.)"""
    write_data(root, "r")
    cfg = TrainConfig(root=str(root), run="r", **TINY_MODEL,
                      batch_size=8, grad_accum=4, warmup_iters=1, max_iters=20, dropout=0.0,
                      spelling=2, time_budget=0, device="cpu")
    once, built = _iterations(cfg, 3, monkeypatch, per_micro_batch=False)
    each, built_each = _iterations(cfg, 3, monkeypatch, per_micro_batch=True)
    assert once.spelled and (built, built_each) == (3, 12)
    for (name, a), b in zip(once.state_dict().items(), each.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_table_of_an_iteration_gets_every_micro_batch_gradient() -> None:
    """Tokens of two bytes share n-grams: the gradients of four micro-batches that share one
    table equal those of four that each build it, to float32 rounding, in every parameter."""
    torch.manual_seed(0)
    config = GPTConfig(**TINY_MODEL, vocab_size=67, spelling=2)
    vocab = [bytes([65 + i % 26, 97 + i // 26]) for i in range(67)]
    model = GPT(config, spell(vocab, 2)).train()
    batches = torch.randint(0, 67, (4, 2, 3, 16))
    grads = []
    for shared in (None, trainer_module.IterationEmbedding(model)):
        model.zero_grad()
        for micro, (x, y) in enumerate(batches):
            table = shared.for_micro_batch(micro == 3) if shared else None
            (model(x, y, embedding=table)[1] / 4).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], grad, atol=1e-7, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--n_embd", "30", "--n_head", "4"], "--n_embd 30: must be divisible by --n_head 4"),
        (["--dropout", "1.0"], "--dropout"),
        (["--learning_rate", "0"], "--learning_rate"),
        (["--min_lr", "1.0"], "--min_lr"),
        (["--warmup_iters", "50", "--max_iters", "50"], "--warmup_iters"),
        (["--batch_size", "0"], "--batch_size"),
        (["--batch_size", "9", "--grad_accum", "2"], "--batch_size 9: must be divisible"),
        (["--time_budget", "-1"], "--time_budget"),
        (["--block_size", "1000"], "--block_size 1000: val.bin holds only"),
        (["--resume", "maybe"], "--resume"),
        (["--lora_rank", "4"], "--lora_rank 4: adapts a pretrained model, whose weights it "
                               "freezes; give --init_from"),
        (["--lora_rank", "-1"], "--lora_rank -1: must be an integer >= 0"),
        (["--lora_alpha", "0"], "--lora_alpha 0.0: must be > 0"),
        (["--lora_targets", "attn.c_attn,wte"], "'wte' is none of attn.c_attn, attn.c_proj"),
        (["--lora_targets", "mlp.c_fc,mlp.c_fc"], "names a projection twice"),
        (["--lora_rank", "4", "--init_from", "gpt2", "--shard", "true"],
         "--shard true with --lora_rank 4: not both"),
    ],
)
def test_bad_hyper_parameters_are_one_line_errors(root: Path, capsys, flags, message) -> None:
    write_data(root, "r")
    argparse_exit = pytest.raises(SystemExit) if "--resume" in flags else contextlib.nullcontext()
    with argparse_exit:
        assert train(root, "r", "--max_iters", "5", "--warmup_iters", "1", *flags) == 2
    err = capsys.readouterr().err
    assert message in err
    if "--resume" not in flags:
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (root / "r" / "ckpt").exists()


def test_ids_are_counted_slice_by_slice_and_an_id_past_the_vocabulary_shows() -> None:
    tokens = np.array([0, 2, 2, 5, 1, 2, 7], dtype=np.uint16)
    assert count_ids(tokens, 4, slice_len=3).tolist() == [1, 1, 3, 0, 0, 1, 0, 1]
    assert count_ids(tokens[:3], 4, slice_len=2).tolist() == [1, 0, 2, 0]


def test_missing_or_inconsistent_data_is_a_one_line_error(root: Path, capsys) -> None:
    assert train(root, "nothing", "--max_iters", "4") == 2
    assert "no training data" in capsys.readouterr().err
    run = write_data(root, "r")
    run.train_bin.write_bytes(run.train_bin.read_bytes()[:-2])  # one token short of meta.json
    assert train(root, "r", "--max_iters", "4") == 2
    err = capsys.readouterr().err
    assert "train.bin" in err and "inconsistent" in err and err.count("\n") == 1
    run = write_data(root, "r")
    meta = json.loads(run.meta_json.read_text())
    run.meta_json.write_text(json.dumps({**meta, "vocab_size": 10}))
    assert train(root, "r", "--max_iters", "4") == 2
    assert "but meta.json says vocab_size 10" in capsys.readouterr().err
    del meta["dtype"]
    run.meta_json.write_text(json.dumps(meta))
    assert train(root, "r", "--max_iters", "4") == 2
    assert "missing key 'dtype'" in capsys.readouterr().err


def test_batches_are_the_same_windows_however_the_iteration_is_split() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    batches = Batches(tokens, block_size=8, batch_size=12, seed=3)
    cpu = torch.device("cpu")
    whole, _ = batches.get(iteration=5, part=0, parts=1, device=cpu)
    for parts in (2, 3, 4, 6):  # e.g. 2 ranks x 3 micro-batches
        shares = [batches.get(5, p, parts, cpu)[0] for p in range(parts)]
        assert torch.equal(torch.cat(shares), whole)
    x, y = batches.get(5, 0, 1, cpu)
    assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the inputs shifted by one
    assert not torch.equal(batches.get(6, 0, 1, cpu)[0], whole)  # each iteration draws anew


def test_eval_windows_cover_a_small_split_without_overlap() -> None:
    offsets = eval_offsets(n_tokens=100, block_size=16, max_windows=1000)
    assert len(offsets) == 6 and offsets[0] == 0 and offsets[-1] + 16 + 1 <= 100
    assert (np.diff(offsets) >= 16).all()
    assert len(eval_offsets(10_000, 16, max_windows=10)) == 10


def test_learning_rate_warms_up_then_decays_by_steps_alone() -> None:
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=110)
    lrs = [lr_at(cfg, s) for s in range(111)]
    assert lrs[0] < lrs[5] < lrs[9] <= 1e-3
    assert lrs[10] == pytest.approx(1e-3) and lrs[60] == pytest.approx(5.5e-4)
    assert lrs[110] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    # a time budget picks where to stop, never the rate of a step
    timed = dataclasses.replace(cfg, time_budget=5)
    assert [lr_at(timed, s) for s in range(111)] == lrs


def finished(*, width: int = 128, **flags) -> TrainConfig:
    """The recipe's finished config of `flags` (with --init_from, from a pretrained model
    `width` wide)."""
    pre = GPTConfig(n_embd=width, n_head=4) if flags.get("init_from") else None
    return finish(TrainConfig(**flags), 64, 10_000, None, pre).config


def test_warmup_defaults_to_fit_a_short_run_and_an_explicit_one_is_checked() -> None:
    assert TrainConfig().warmup_iters is None  # unset until the recipe decides it
    assert finished().warmup_iters == 30
    assert finished(max_iters=40).warmup_iters == 10
    assert finished(max_iters=1).warmup_iters == 0
    with pytest.raises(ValueError, match=r"^--warmup_iters 40: must be in \[0, --max_iters 40\)"):
        TrainConfig(max_iters=40, warmup_iters=40)


def test_with_init_from_the_unset_schedule_is_the_fine_tuning_recipe() -> None:
    """A peak of FINETUNE_LR at the default model's width (smaller as 1 / width: the pretrained
    model's, from its config, before any weights are read), decaying to a tenth of it, no
    warmup; each flag given is kept, and a given peak decays to a tenth of itself."""
    tuned = finished(init_from="runs/earlier/model", max_iters=600)
    assert (tuned.learning_rate, tuned.min_lr) == (FINETUNE_LR, pytest.approx(FINETUNE_LR / 10))
    assert tuned.warmup_iters == 0
    assert lr_at(tuned, 0) == FINETUNE_LR and lr_at(tuned, 600) == pytest.approx(FINETUNE_LR / 10)
    assert finished(init_from="gpt2", width=768).learning_rate == pytest.approx(FINETUNE_LR / 6)
    # a width given as a flag is the model's
    assert finished(init_from="gpt2", width=768, n_embd=1600).learning_rate == \
        pytest.approx(4e-5)
    lower = finished(init_from="gpt2", learning_rate=3e-5)
    assert (lower.learning_rate, lower.min_lr) == (3e-5, pytest.approx(3e-6))
    given = finished(init_from="gpt2", width=768, learning_rate=3e-5, min_lr=3e-5,
                     warmup_iters=20)  # fmt: skip
    assert (given.learning_rate, given.min_lr, given.warmup_iters) == (3e-5, 3e-5, 20)
    with pytest.raises(InputError, match=r"^--min_lr 0.0002: must be in \[0, --learning_rate\]"):
        finished(init_from="gpt2", width=768, min_lr=2e-4)
    scratch = finished()
    assert (scratch.learning_rate, scratch.min_lr) == (1e-3, 1e-4)


def test_with_lora_the_unset_peak_is_the_adapters() -> None:
    """--lora_rank: LORA_LR at the default model's width, 1 / width smaller for a wider one
    (ten times full fine-tuning's), to a tenth of it, no warmup; a given peak is kept."""
    lora = finished(init_from="gpt2", lora_rank=8)
    assert (lora.learning_rate, lora.min_lr) == (LORA_LR, pytest.approx(LORA_LR / 10))
    assert lora.warmup_iters == 0
    assert finished(init_from="gpt2", width=1024, lora_rank=8).learning_rate == \
        pytest.approx(6.25e-4)
    assert finished(init_from="gpt2", lora_rank=8, learning_rate=1e-4).learning_rate == 1e-4


def test_unset_dropout_is_on_only_where_the_run_sees_its_text_again(root: Path, capsys) -> None:
    # The default corpus (25,648 training tokens) is seen 18 times by the default run; the plays
    # (1,374,927) a third of once.
    def dropout(cfg: TrainConfig, train_tokens: int) -> float:  # of a new run
        return finish(cfg, 64, train_tokens).model.dropout

    assert dropout(TrainConfig(), 25_648) == DROPOUT_REPEATED == 0.2
    assert dropout(TrainConfig(), 1_374_927) == 0.0
    assert dropout(TrainConfig(), 600 * 12 * 64) == 0.0  # exactly one pass: nothing repeats
    assert dropout(TrainConfig(dropout=0.1), 10**9) == 0.1  # a value given is a value kept
    rundir = write_data(root, "r")
    train_tokens = DataMeta.read(rundir.meta_json).train_tokens
    once = train_tokens // (TINY["batch_size"] * TINY["block_size"])  # tokens a step
    assert train(root, "r", "--max_iters", str(once), "--eval_interval", "1000") == 0
    assert "dropout 0 |" in capsys.readouterr().out
    # Raised --max_iters, resumed: what the run started with holds (a checkpoint of another
    # model would be refused), the average too.
    assert train(root, "r", "--max_iters", str(once + 1), "--eval_interval", "1000") == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "dropout 0 |" in out
    assert train(root, "r", "--max_iters", str(once + 1), "--eval_interval", "1000",
                 "--resume", "never") == 0
    assert "dropout 0.2 |" in capsys.readouterr().out


def test_help_lists_every_knob() -> None:
    text = build_parser(TrainConfig, "p", "d").format_help()
    for flag in ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "batch_size",
                 "grad_accum", "max_iters", "time_budget", "learning_rate", "min_lr",
                 "warmup_iters", "weight_decay", "grad_clip", "eval_interval", "eval_iters",
                 "log_interval", "ckpt_interval", "keep_last", "resume", "seed", "device",
                 "dtype", "compile"):
        assert f"--{flag}" in text


@pytest.mark.slow
def test_default_flags_are_reproducible_and_a_killed_run_resumes_bit_identical(
    root: Path, tmp_path_factory, capsys
):
    """What the README promises, with the defaults (no --time_budget, no --warmup_iters): the
    same command twice gives bit-identical weights, and so does the same command SIGKILLed
    after a checkpoint and started again."""
    for run in ("b", "killed"):
        write_data(root, run)

    def argv(run: str) -> list[str]:
        return ["train-gpt", "--root", str(root), "--run", run, *DEFAULT_FLAGS]

    def command(run: str) -> list[str]:
        return [sys.executable, "-m", "gpt", *argv(run)]

    straight = default_flags_run(tmp_path_factory)  # the command as a process
    assert in_process(*argv("b")) == 0  # the same command again, in this test's process
    a = model_weights(straight)
    assert_same_weights(model_weights(RunDir.of(root, "b")), a)

    env = {**os.environ, **ONE_THREAD}
    killed = RunDir.of(root, "killed")
    proc = subprocess.Popen(command("killed"), stdout=subprocess.DEVNULL, env=env)
    while not killed.latest.exists() and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(random.uniform(0, 1.0))  # somewhere after the first checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not killed.model_dir.exists(), "the kill came too late to test a resume"
    capsys.readouterr()
    assert in_process(*argv("killed")) == 0  # the same command again, in this test's process
    assert "resumed from step-" in capsys.readouterr().out
    assert_same_weights(model_weights(killed), a)
    assert [r["loss"] for r in records(killed)] == [r["loss"] for r in records(straight)]


@pytest.mark.slow
def test_a_smoke_test_run_needs_no_other_flag(root: Path) -> None:
    write_data(root, "r")
    threads = torch.get_num_threads()
    try:
        assert gpt_main(["train-gpt", "--root", str(root), "--run", "r", "--max_iters", "40"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = records(RunDir.of(root, "r"))
    assert rows[-1]["step"] == 40
    assert [r["step"] for r in rows if "loss" in r] == [1, 10, 20, 30, 40]
    lrs = [r["lr"] for r in rows]  # warmed up over 10 steps, then decayed towards min_lr
    assert lrs[1] == pytest.approx(1e-3 * 10 / 11) and lrs[-1] < 1.1e-4


def test_one_process_leaves_a_full_thread_pool_as_torch_made_it(monkeypatch) -> None:
    """torch.set_num_threads also turns off MKL's dynamic threading (fewer threads for a small
    matmul; 1-2% of a baby GPT's CPU step here), so setup calls it only to change the count: for
    ranks that share a machine's cores, not for one process that has them all."""
    cores = usable_cores()
    calls: list[int] = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    setup("cpu")
    assert calls == []
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cores))  # torchrun's, without a process group
    setup("cpu")
    assert calls == [1]
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(world, "usable_cores", lambda: 1)  # a container limited to one CPU
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores + 1)  # torch counts the node's
    setup("cpu")
    assert calls == [1, 1]


def test_every_metrics_row_has_the_elapsed_time(root: Path) -> None:
    write_data(root, "r")
    assert train(root, "r", "--max_iters", "7", "--log_interval", "5", "--eval_interval", "3") == 0
    rows = records(RunDir.of(root, "r"))
    assert [r["step"] for r in rows] == [1, 3, 5, 6, 7]  # evaluations at 3, 6, 7 are not log steps
    assert all(r["elapsed_s"] > 0 for r in rows)


def loss_curve(root: Path, run: str, *flags: str) -> list[float]:
    """Train a new run `run` with `flags`; its training loss at every logged step."""
    write_data(root, run)
    assert train(root, run, *flags) == 0
    return [r["loss"] for r in records(RunDir.of(root, run)) if "loss" in r]


def test_bf16_follows_the_float32_loss_curve(root: Path) -> None:
    """bfloat16 autocast (the default on a GPU; here forced on the CPU) stays within 2% of a
    float32 run of the same model, step by step, over the first 50 steps."""
    curves = {dtype: loss_curve(root, dtype, "--max_iters", "50", "--log_interval", "1",
                                "--dtype", dtype, "--dropout", "0")
              for dtype in ("float32", "bfloat16")}
    assert len(curves["float32"]) == len(curves["bfloat16"]) == 50
    assert curves["float32"][-1] < curves["float32"][0] - 0.5  # it learned: the curve says a lot
    gaps = [abs(b - a) / a for a, b in zip(curves["float32"], curves["bfloat16"], strict=True)]
    assert 0 < max(gaps) < 0.02


@pytest.mark.slow
@pytest.mark.compile
def test_a_compiled_step_trains_as_the_eager_one(root: Path, monkeypatch) -> None:
    """`torch.compile` with the chunked loss, both the default on a GPU, checked where CI can run
    them: on the CPU, the same per-step losses as eager mode (with the padded vocabulary's -inf
    fill, the chunked loss's autograd.Function over several chunks and the optimizer's found_inf
    flag inside the compiled graph's reach). The eager chunked loss is the whole logits' to 1e-6
    (tests/workload/models/test_model.py); one compile here, as each costs CI half a minute."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 64 * 64 * 4)  # at most 64 rows: 2 chunks or more
    curves = {compiled: loss_curve(root, f"compile-{compiled}", "--max_iters", "6",
                                   "--log_interval", "1", "--compile", compiled, "--dropout", "0",
                                   "--chunked_loss", "true")
              for compiled in ("false", "true")}
    assert len(curves["true"]) == 6
    assert curves["true"] == pytest.approx(curves["false"], rel=1e-4)


def test_compiling_by_default_needs_the_c_compiler_triton_would_find(monkeypatch,
                                                                     tmp_path: Path) -> None:
    from gpt.training.compute import c_compiler

    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, no clang
    assert c_compiler() is None
    (tmp_path / "clang").write_text("#!/bin/sh\n")
    (tmp_path / "clang").chmod(0o755)
    assert c_compiler() == str(tmp_path / "clang")
    monkeypatch.setenv("CC", "/opt/cc")
    assert c_compiler() == "/opt/cc"
