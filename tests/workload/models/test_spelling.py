"""The spelled embedding: n-grams numbered the same every time, each row its free vector plus
its spelling's mean, exported as the plain table it is, and kept by a resumed run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from support.runs import TEXT, TINY_MODEL, train, write_data

from gpt.config.configs import GPTConfig, TrainConfig
from gpt.models.export import load_export, save_export
from gpt.models.model import GPT
from gpt.models.spelling import FREE_MIN_COUNT, free_vectors, spell
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import CharTokenizer, load_tokenizer
from gpt.training import checkpoint_files
from gpt.training.recipe import DEFAULT_SPELLING, finish


def test_a_token_is_spelt_in_its_bytes_and_its_marked_byte_pairs() -> None:
    s = spell([b"ab", b"b", b"ba"], 2)
    grams = [s.index[s.offsets[i] : (s.offsets[i + 1] if i + 1 < 3 else None)].tolist()
             for i in range(3)]  # fmt: skip
    # "ab": a, b, ^a, ab; "b": b, ^b; "ba": b, a, ^b, ba. Numbered by first appearance.
    assert grams == [[0, 1, 2, 3], [1, 4], [1, 0, 4, 5]]
    assert s.grams == 6 and s.vocab_size == 3
    assert s.weights.tolist() == [0.25] * 4 + [0.5] * 2 + [0.25] * 4  # each bag is a mean
    again = spell([b"ab", b"b", b"ba"], 2)
    assert all(torch.equal(getattr(s, f), getattr(again, f)) for f in ("index", "offsets"))
    assert spell([b"ab", b"b"], 1).index.tolist() == [0, 1, 1]  # bytes only
    with pytest.raises(ValueError, match="at least 1"):
        spell([b"a"], 0)


def _spelled_model(vocab: list[bytes]) -> GPT:
    config = GPTConfig(**TINY_MODEL, vocab_size=len(vocab), spelling=2)
    torch.manual_seed(0)
    return GPT(config, spell(vocab, 2)).eval()


def test_a_row_is_its_free_vector_plus_the_mean_of_its_n_gram_vectors() -> None:
    model = _spelled_model([b"a", b"b", b"ab"])
    n_grams = model.transformer.wse.weight  # a, ^a, b, ^b, ab in order of appearance
    want = model.lm_head.weight[2] + (n_grams[0] + n_grams[1] + n_grams[2] + n_grams[4]) / 4
    torch.testing.assert_close(model.embedding()[2], want)


def test_a_token_never_in_training_is_its_spelling_alone_and_gets_no_gradient() -> None:
    vocab = [b"a", b"b", b"ab"]
    config = GPTConfig(**TINY_MODEL, vocab_size=3, spelling=2)
    torch.manual_seed(0)
    model = GPT(config, spell(vocab, 2, free=[True, False, True]))
    table, n_grams = model.lm_head.weight, model.transformer.wse.weight  # a, ^a, b, ^b, ab
    assert not table[1].any() and table[0].any() and table[2].any()
    torch.testing.assert_close(model.embedding()[1], (n_grams[2] + n_grams[3]) / 2)
    idx = torch.tensor([[0, 1, 2, 1, 0, 2]])
    model(idx, targets=idx)[1].backward()  # "b" both input and target: still no gradient
    assert not table.grad[1].any() and table.grad[0].any() and table.grad[2].any()
    assert n_grams.grad[3].any()  # its spelling learns from it
    with pytest.raises(ValueError, match="2 flags for a vocabulary of 3"):
        spell(vocab, 2, free=[True, False])


def test_only_a_small_text_spells_its_rare_tokens_alone() -> None:
    # 1 token in 50 occurs once (2% > NOVEL_SHARE): new text will hold tokens this one lacks.
    small = np.array([1, 0, 2, 40, 3, 4] + [0] * 10)
    assert FREE_MIN_COUNT == 3
    assert free_vectors(small).tolist() == [False, False, False, True, True, True] + [False] * 10
    # 1 in 5,000: those it lacks are BPE's merge steps, which no text holds.
    large = np.array([1, 0, 3000, 1996, 0])
    assert free_vectors(large).all()


def test_a_run_on_a_small_text_keeps_the_rows_of_its_rare_tokens_at_zero(
    root: Path, capsys
) -> None:
    # A small text: 80 characters once each (1.5% of the training split), and Z, z and ! in
    # the held-out tenth alone.
    once = "".join(chr(0x100 + i) for i in range(80))
    run = write_data(root, "u", text=once + TEXT + "Zz!\n" * 12)
    assert train(root, "u", "--max_iters", "6") == 0
    assert "(83 rare tokens spelled alone)" in capsys.readouterr().out  # the 80, and Z, z, !
    tokenizer = load_tokenizer(run.tokenizer_json)
    chars = "".join(tokenizer.decode([i]) for i in range(tokenizer.vocab_size))
    rare = [chars.index(c) for c in "Zz!" + once[:2]]
    table = load_file(run.ckpt_step(6) / checkpoint_files.MODEL)["lm_head.weight"]
    assert not table[rare].any() and table[chars.index("A")].any()
    exported, _ = load_export(run.model_dir)  # their rows there: the spelling's mean, learned
    assert exported.lm_head.weight[rare].abs().min(dim=1).values.all()


def test_the_export_is_a_plain_table_with_the_spelled_models_logits(tmp_path: Path) -> None:
    chars = "abc \n"
    model = _spelled_model([c.encode() for c in chars])
    torch.nn.init.normal_(model.transformer.wse.weight, std=0.5)  # make the spelling count
    save_export(model, CharTokenizer(chars), tmp_path / "model")
    plain, _ = load_export(tmp_path / "model")
    assert not plain.spelled and plain.config.spelling == 0
    idx = torch.tensor([[0, 1, 2, 3, 4, 0]])
    torch.testing.assert_close(plain(idx)[0], model(idx)[0])
    assert json.loads((tmp_path / "model" / "config.json").read_text())["vocab_size"] == 5


def test_unset_spelling_is_the_default_for_a_new_run_and_the_saved_one_on_resume(
    root: Path, capsys
) -> None:
    run = write_data(root, "s")
    assert train(root, "s", "--max_iters", "4", "--ckpt_interval", "2") == 0
    state = json.loads((run.ckpt_dir / "step-4" / checkpoint_files.STATE).read_text())
    assert state["model"]["spelling"] == DEFAULT_SPELLING
    assert "spelled in" in capsys.readouterr().out
    # An explicit other value is a different model: one line, nothing overwritten.
    assert train(root, "s", "--max_iters", "6", "--spelling", "0") == 2
    err = capsys.readouterr().err
    assert "different model" in err and "spelling 2 -> 0" in err and err.count("\n") == 1
    assert checkpoint_files.find_latest(run).name == "step-4"


def test_a_checkpoint_from_before_spelling_resumes_as_a_plain_table(root: Path, capsys) -> None:
    run: RunDir = write_data(root, "old")
    assert train(root, "old", "--max_iters", "4", "--spelling", "0") == 0
    # Rewrite the checkpoint's state as the code before --spelling wrote it: no such key.
    path = run.ckpt_dir / "step-4" / checkpoint_files.STATE
    state = json.loads(path.read_text())
    del state["model"]["spelling"]
    del state["config"]["spelling"]
    path.write_text(json.dumps(state))
    capsys.readouterr()
    assert train(root, "old", "--max_iters", "6") == 0
    out = capsys.readouterr().out
    assert "resumed from step-4" in out and "spelled in" not in out


def test_the_flag_is_checked() -> None:
    for bad in (-1, 5, True, 1.5):
        with pytest.raises(ValueError, match="--spelling"):
            TrainConfig(spelling=bad)
    assert finish(TrainConfig(), 10, 100).model.spelling == DEFAULT_SPELLING
    assert GPTConfig().spelling == 0  # a model built outside training: a plain table
    assert finish(TrainConfig(spelling=0), 10, 100).model.spelling == 0
