"""A GPT-2 folder as transformers writes it, read into our GPT (gpt/models/pretrained.py): the
same logits as transformers' GPT2LMHeadModel, its shape taken, contradicting flags refused.
The GPT-2s are random and written here (tests/support/gpt2.py): nothing downloads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.torch
import torch
from support.gpt2 import OTHER_GPT2, SMALL_GPT2, gpt2_folder, gpt2_tokenizer_files
from support.runs import assert_same_weights

from gpt.config.configs import GPTConfig, TrainConfig
from gpt.errors import InputError
from gpt.models import pretrained
from gpt.models.export import load_unpadded
from gpt.models.model import GPT
from gpt.tokenizer.kinds import GPT2Tokenizer
from gpt.tokenizer.recognition import pretrained_tokenizer


@pytest.fixture(scope="module")
def gpt2s(tmp_path_factory):
    """Both shapes' folders and transformers' models of them."""
    root = tmp_path_factory.mktemp("gpt2")
    return {name: (root / name, gpt2_folder(root / name, shape, seed=i))
            for i, (name, shape) in enumerate((("small", SMALL_GPT2), ("other", OTHER_GPT2)))}


def ours(folder, config: GPTConfig | None = None, rows=None) -> GPT:
    pre = pretrained.read(folder)
    config = config or pre.config
    rows = np.arange(pre.config.vocab_size) if rows is None else rows
    model = GPT(config)
    load_unpadded(model, pretrained.initial_weights(pre, config, rows))
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["small", "other"])
def test_a_gpt2_folder_gives_transformers_logits(gpt2s, name):
    folder, theirs = gpt2s[name]
    model = ours(folder)
    shape = SMALL_GPT2 if name == "small" else OTHER_GPT2
    assert (model.config.n_layer, model.config.n_head, model.config.n_embd,
            model.config.block_size, model.config.activation, model.config.bias,
            model.config.position, model.config.vocab_size) == (
        shape["n_layer"], shape["n_head"], shape["n_embd"], shape["n_positions"],
        shape["activation_function"], True, "learned", 50257)  # fmt: skip
    seeded = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50257, (2, shape["n_positions"]), generator=seeded)
    with torch.no_grad():
        got, want = model(ids)[0], theirs(ids).logits
    assert got.dtype == want.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()


def test_the_tanh_gelu_is_what_makes_gpt2_exact(gpt2s):
    """The exact GELU on gelu_new weights is off by more than the tolerance: the test above
    tells the two apart."""
    folder, theirs = gpt2s["small"]
    pre = pretrained.read(folder)
    wrong = ours(folder, GPTConfig(**{**vars(pre.config), "activation": "gelu"}))
    ids = torch.arange(64)[None] * 700
    with torch.no_grad():
        assert (wrong(ids)[0] - theirs(ids).logits).abs().max() > 1e-4


def test_a_shorter_block_size_crops_the_positions(gpt2s):
    folder, theirs = gpt2s["small"]
    pre = pretrained.read(folder)
    model = ours(folder, GPTConfig(**{**vars(pre.config), "block_size": 16}))
    assert model.transformer.wpe.weight.shape == (16, 32)
    ids = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(model(ids)[0], theirs(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_compacted_vocabulary_starts_from_its_tokens_rows(gpt2s):
    folder, theirs = gpt2s["small"]
    kept = GPT2Tokenizer.fit(["The Comedy of Errors"]).kept
    pre = pretrained.read(folder)
    rows = pretrained.row_map(GPT2Tokenizer(kept), pretrained_tokenizer(folder), "data")
    model = ours(folder, GPTConfig(**{**vars(pre.config), "vocab_size": len(kept)}), rows)
    ids = torch.tensor([[5, 100, 257, len(kept) - 1]])
    with torch.no_grad():
        want = theirs(torch.tensor(kept)[ids]).logits[..., kept]
        assert torch.allclose(model(ids)[0], want, atol=1e-4, rtol=0)


def test_the_hubs_unprefixed_names_and_mask_buffers_read_the_same(gpt2s, tmp_path):
    """openai-community/gpt2's model.safetensors is GPT2Model's: `h.0.attn.c_attn.weight`,
    no `transformer.`, and the attention masks `h.N.attn.bias` saved as tensors."""
    folder, _ = gpt2s["small"]
    tensors = safetensors.torch.load_file(folder / "model.safetensors")
    hub = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    hub |= {f"h.{i}.attn.bias": torch.ones(1, 1, 64, 64) for i in range(2)}
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    safetensors.torch.save_file(hub, tmp_path / "model.safetensors")
    a, b = pretrained.read(folder), pretrained.read(tmp_path)
    assert_same_weights(b.weights, a.weights)


@pytest.mark.slow
def test_gpt2s_own_tokenizer_is_the_shipped_bpe(tmp_path):
    gpt2_tokenizer_files(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["pre_tokenizer"]["type"] == \
        "ByteLevel"  # GPT-2's, not the Split + ByteLevel this project's export writes
    tok = pretrained_tokenizer(tmp_path)
    assert isinstance(tok, GPT2Tokenizer) and tok.kept is None
    (tmp_path / "tokenizer.json").unlink()  # vocab.json alone, as older GPT-2 folders
    assert pretrained_tokenizer(tmp_path).kept is None
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    del vocab["Ġthe"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(InputError, match="not GPT-2's"):
        pretrained_tokenizer(tmp_path)


def cfg(**flags) -> TrainConfig:
    return TrainConfig(init_from="x", **flags)


@pytest.mark.parametrize("flags, message", [
    (dict(n_layer=4), "--n_layer 4: contradicts --init_from, whose n_layer is 2"),
    (dict(n_embd=64), "--n_embd 64: contradicts --init_from, whose n_embd is 32"),
    (dict(position="rope"), "--position rope: contradicts --init_from, whose position is learned"),
    (dict(activation="gelu"), "--activation gelu: contradicts --init_from, whose activation "
                              "is gelu_new"),
    (dict(bias=False), "--bias false: contradicts --init_from, whose bias is true"),
    (dict(block_size=65), "--block_size 65: larger than --init_from's context, 64 positions"),
    (dict(spelling=2), "--spelling 2: --init_from's embedding is a plain table"),
])  # fmt: skip
def test_a_flag_contradicting_the_checkpoint_is_refused_in_one_line(gpt2s, flags, message):
    pre = pretrained.read(gpt2s["small"][0])
    with pytest.raises(InputError, match=message) as e:
        pretrained.check_flags(cfg(**flags), pre.config)
    assert "\n" not in str(e.value)


def test_flags_that_agree_or_are_unset_pass(gpt2s):
    pre = pretrained.read(gpt2s["small"][0])
    pretrained.check_flags(cfg(n_layer=2, n_head=2, bias=True, block_size=64), pre.config)
    pretrained.check_flags(cfg(block_size=8), pre.config)


def test_unusable_folders_are_one_line_each(gpt2s, tmp_path):
    folder, _ = gpt2s["small"]
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="no \\*.safetensors weights"):
        pretrained.read(tmp_path)
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    llama = {**config, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    with pytest.raises(InputError, match="architecture LlamaForCausalLM .* is not one this "
                                         "project builds"):
        pretrained.read(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_inner": 100}))
    with pytest.raises(InputError, match="n_inner 100"):
        pretrained.read(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_embd": 64}))
    with pytest.raises(InputError, match="its config.json implies"):
        pretrained.read(tmp_path)
