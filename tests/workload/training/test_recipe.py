"""A checkpoint's typed state (gpt/training/checkpoint_files.py's `CheckpointState`) and the
recipe (gpt/training/recipe.py's `finish`): what every unset flag becomes, new, fine-tuned or
resumed, in one finished, read-only config, decided before the model is built."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from support.paths import FIXTURES
from support.runs import train, write_data

from gpt.config.configs import GPTConfig, TrainConfig
from gpt.errors import InputError
from gpt.rundir.layout import RunDir
from gpt.training import checkpoint_files
from gpt.training.checkpoint_files import CheckpointState, TrainState
from gpt.training.recipe import (
    DEFAULT_EMA_DECAY,
    DEFAULT_SPELLING,
    DROPOUT_REPEATED,
    Device,
    finish,
)

# state.json as the code before the typed state wrote it (main at ff6af88, a TINY run of 4 steps
# with --ema_decay 0.9 on write_data's text): the format on disk this code must keep reading.
BEFORE = FIXTURES / "state-before-issue-38.json"


def _state(**changes) -> CheckpointState:
    state = CheckpointState(
        train=TrainState(step=40, elapsed_s=12.5, tokens=5120),
        model=GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=39,
                        dropout=0.05, spelling=3),
        ema_decay=0.9,
        data={"corpus_sha256": "ab", "tokenizer": "char", "vocab_size": 39,
              "train_tokens": 5544, "val_tokens": 616},
        config={"max_iters": 40, "dropout": None},
        world_size=2,
    )
    return dataclasses.replace(state, **changes)


# -- the typed state -------------------------------------------------------------------------


def test_the_state_round_trips_through_json() -> None:
    state = _state()
    text = json.dumps(state.to_json(), indent=2, sort_keys=True)
    assert CheckpointState.from_json(json.loads(text), has_average=True) == state


def test_a_state_json_the_earlier_code_wrote_reads_and_writes_back_byte_for_byte() -> None:
    text = BEFORE.read_text()
    state = CheckpointState.from_json(json.loads(text), has_average=True)
    assert state.train == TrainState(step=4, elapsed_s=0.13920150699959777, tokens=512)
    assert state.model.spelling == 2 and state.model.dropout == 0.0 and state.ema_decay == 0.9
    assert json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n" == text


def test_a_run_resumes_a_checkpoint_whose_state_the_earlier_code_wrote(root: Path,
                                                                        capsys) -> None:
    run = write_data(root, "old")
    flags = ("--max_iters", "4", "--ema_decay", "0.9")
    assert train(root, "old", *flags) == 0
    shutil.copy(BEFORE, run.ckpt_step(4) / checkpoint_files.STATE)
    capsys.readouterr()
    # --ema_decay left out: the 0.9 comes from the earlier code's state.json.
    assert train(root, "old", "--max_iters", "6") == 0
    out = capsys.readouterr().out
    assert "resumed from step-4: step 4" in out
    assert checkpoint_files.read_state(run.ckpt_step(6)).ema_decay == 0.9


def test_older_states_read_with_the_keys_they_lack_at_the_values_they_implied() -> None:
    raw = _state().to_json()
    del raw["ema_decay"]  # before the decay was recorded: the default, where there is an average
    del raw["model"]["spelling"]  # before --spelling: a plain table
    assert CheckpointState.from_json(raw, has_average=True).ema_decay == DEFAULT_EMA_DECAY
    assert CheckpointState.from_json(raw, has_average=False).ema_decay == 0.0
    assert CheckpointState.from_json(raw, has_average=False).model.spelling == 0


def _broken(change) -> dict:
    raw = _state().to_json()
    change(raw)
    return raw


@pytest.mark.parametrize(("raw", "reason"), [
    ([1, 2], "not a JSON object"),
    (_broken(lambda r: r.pop("train")), "missing key 'train'"),
    (_broken(lambda r: r["train"].pop("step")), "train: missing key 'step'"),
    (_broken(lambda r: r["train"].update(step=-1)), "train.step -1"),
    (_broken(lambda r: r["train"].update(elapsed_s="1")), "train.elapsed_s '1'"),
    (_broken(lambda r: r["model"].pop("n_layer")), "model: missing key 'n_layer'"),
    (_broken(lambda r: r["model"].update(n_head=3)), "model: --n_embd 32: must be divisible"),
    (_broken(lambda r: r.update(data=[])), "data: not a JSON object"),
    (_broken(lambda r: r.update(ema_decay=1.5)), "ema_decay 1.5"),
    (_broken(lambda r: r.update(world_size=0)), "world_size 0"),
])
def test_a_malformed_state_is_a_one_line_error_naming_the_file(tmp_path: Path, raw,
                                                                reason: str) -> None:
    (tmp_path / checkpoint_files.STATE).write_text(json.dumps(raw))
    with pytest.raises(InputError) as e:
        checkpoint_files.read_state(tmp_path)
    message = str(e.value)
    state = tmp_path / checkpoint_files.STATE
    assert message.startswith(f"{state}: not a checkpoint state ({reason}")
    assert "\n" not in message


def test_a_run_on_a_malformed_state_fails_in_one_line_and_keeps_the_checkpoint(root: Path,
                                                                                capsys) -> None:
    run = write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    path = run.ckpt_step(4) / checkpoint_files.STATE
    path.write_text(json.dumps(_broken(lambda r: r.pop("model"))))
    before = run.train_jsonl.read_text()
    capsys.readouterr()
    assert train(root, "r", "--max_iters", "8") == 2
    err = capsys.readouterr().err
    assert f"{path}: not a checkpoint state (missing key 'model')" in err and err.count("\n") == 1
    assert run.latest.read_text().strip() == "step-4" and run.train_jsonl.read_text() == before


# -- the rule ---------------------------------------------------------------------------------

# A new run of the default flags on 100 training tokens passes over them many times: dropout
# on, an average. The saved state started otherwise: dropout 0.05, spelling 3, decay 0.9.
TOKENS = 100


def _resolved(saved: CheckpointState | None, **flags) -> tuple[float, int, float]:
    resolved = finish(TrainConfig(**flags), 39, TOKENS, saved)
    return resolved.model.dropout, resolved.model.spelling, resolved.config.ema_decay


def test_unset_a_new_run_takes_the_default_rule() -> None:
    assert _resolved(None) == (DROPOUT_REPEATED, DEFAULT_SPELLING, DEFAULT_EMA_DECAY)
    # ... which depends on the data: a split larger than the run's tokens sees no repeat.
    resolved = finish(TrainConfig(), 39, 10**7)
    assert (resolved.model.dropout, resolved.config.ema_decay) == (0.0, 0.0)


def test_unset_a_resumed_run_keeps_what_it_started_with() -> None:
    assert _resolved(_state()) == (0.05, 3, 0.9)
    # Zeros are values kept, not "unset": a run started without dropout, spelling or average
    # resumes without them although a new run would now have them.
    zeros = _state(model=dataclasses.replace(_state().model, dropout=0.0, spelling=0),
                   ema_decay=0.0)
    assert _resolved(zeros) == (0.0, 0, 0.0)


@pytest.mark.parametrize("saved", [None, _state()], ids=["new run", "resumed"])
def test_a_flag_given_wins(saved: CheckpointState | None) -> None:
    assert _resolved(saved, dropout=0.1, spelling=1, ema_decay=0.5) == (0.1, 1, 0.5)
    assert _resolved(saved, dropout=0.0, spelling=0, ema_decay=0.0) == (0.0, 0, 0.0)


def test_the_model_has_the_flags_shape_and_the_datas_vocabulary() -> None:
    resolved = finish(TrainConfig(n_layer=3, n_embd=48, n_head=3), 77, TOKENS)
    model = resolved.model
    assert (model.n_layer, model.n_embd, model.n_head, model.vocab_size) == (3, 48, 3, 77)


def test_a_new_fine_tuning_run_takes_the_pretrained_shape_a_plain_table_and_the_dropout_rule():
    """--init_from: the checkpoint's shape, no spelling, and dropout by from scratch's rule (a
    small text fine-tuned overfits as one trained from scratch does)."""
    pre = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50257, bias=True,
                    position="learned", activation="gelu_new")  # fmt: skip
    tuned = finish(TrainConfig(init_from="x"), 39, TOKENS, None, pre)
    assert (tuned.model.n_layer, tuned.model.n_embd, tuned.model.position) == (2, 32, "learned")
    assert (tuned.model.dropout, tuned.model.spelling) == (DROPOUT_REPEATED, 0)
    assert finish(TrainConfig(init_from="x"), 39, 10**7, None, pre).model.dropout == 0.0


# -- the finished config ---------------------------------------------------------------------

CUDA = Device(type="cuda", name="an A100", bf16=True, c_compiler=True)
UNSETTABLE = [f.name for f in dataclasses.fields(TrainConfig) if f.default is None]


@pytest.mark.parametrize("case", ["from scratch", "fine-tuned", "resumed"])
def test_the_finished_config_decides_every_unset_flag_and_is_read_only(case: str) -> None:
    pre = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, position="learned")
    cfg = TrainConfig(init_from="x") if case == "fine-tuned" else TrainConfig()
    recipe = finish(cfg, 39, TOKENS, _state() if case == "resumed" else None,
                    pre if case == "fine-tuned" else None)
    finished = recipe.config
    assert len(UNSETTABLE) >= 14 and all(getattr(cfg, k) is None for k in UNSETTABLE)
    assert [k for k in UNSETTABLE if getattr(finished, k) is None] == []
    assert (finished.device, finished.dtype, finished.compile, finished.chunked_loss) == (
        "cpu", "float32", False, False)
    # the model it builds is the one it says
    assert {k: getattr(recipe.model, k) for k in ("n_layer", "n_embd", "dropout", "spelling")} \
        == {k: getattr(finished, k) for k in ("n_layer", "n_embd", "dropout", "spelling")}
    with pytest.raises(dataclasses.FrozenInstanceError, match="the run's config is finished"):
        finished.learning_rate = 1.0
    again = dataclasses.replace(finished, max_iters=700)  # a copy is a config like any other
    again.max_iters = 800
    assert cfg.learning_rate is None  # what the person gave is left as it was


def test_a_resumed_run_finishes_as_its_first_start_did() -> None:
    """The decisions a resumed run keeps (shape, dropout, spelling, average) are read from its
    checkpoint, the others made again the same way: the same finished config."""
    first = finish(TrainConfig(), 39, TOKENS)
    saved = CheckpointState(TrainState(step=40), first.model, first.config.ema_decay, {}, {}, 1)
    resumed = finish(TrainConfig(), 39, 10**7, saved)  # a larger text would change a new run's
    assert dataclasses.asdict(resumed.config) == dataclasses.asdict(first.config)
    assert resumed.model == first.model


def test_the_device_decides_compile_dtype_and_the_chunked_loss() -> None:
    on_gpu = finish(TrainConfig(), 39, TOKENS, device=CUDA)
    assert (on_gpu.config.device, on_gpu.config.compile, on_gpu.config.dtype,
            on_gpu.config.chunked_loss, on_gpu.notes) == ("cuda", True, "bfloat16", True, ())
    old = Device(type="cuda", name="a V100", bf16=False, c_compiler=False)
    no_compiler = finish(TrainConfig(), 39, TOKENS, device=old)
    assert (no_compiler.config.compile, no_compiler.config.dtype) == (False, "float32")
    assert "Triton finds no C compiler" in no_compiler.notes[0]
    with pytest.raises(InputError, match=r"^--dtype bfloat16: a V100 has no bfloat16; use "):
        finish(TrainConfig(dtype="bfloat16"), 39, TOKENS, device=old)
    given = finish(TrainConfig(compile=False, chunked_loss=False, dtype="float32"), 39, TOKENS,
                   device=CUDA)  # fmt: skip
    assert (given.config.compile, given.config.chunked_loss, given.config.dtype) == (
        False, False, "float32")
    assert finish(TrainConfig(fused_loss=True), 39, TOKENS).config.chunked_loss is True


def test_the_run_records_its_finished_config(root: Path) -> None:
    """What each unset flag became is in the checkpoint's saved flags and the report's command
    line, decided before the model was built."""
    write_data(root, "r")
    assert train(root, "r", "--max_iters", "4") == 0
    run = checkpoint_files.find_latest(RunDir.of(root, "r"))
    flags = checkpoint_files.read_state(run).config
    assert [k for k in UNSETTABLE if flags[k] is None] == []
    assert (flags["device"], flags["dtype"], flags["compile"]) == ("cpu", "float32", False)
    report = RunDir.of(root, "r").report_md.read_text()
    assert "--device cpu" in report and f"--dropout {flags['dropout']}" in report
