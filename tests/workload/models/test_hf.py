"""model/ is a Hugging Face directory: the real transformers loads it offline, with no custom
code, and computes what our model computes (gpt/models/hf.py, gpt/models/export.py).

Every model option maps to an architecture transformers knows (rotary: GPT-NeoX; learned
positions: GPT-2; squared ReLU or GELU; with or without bias); the default one is held to the
issue's bar: logits within 1e-4 in float32, and the same greedy tokens and text as our CLI's for
prompts from the corpus, from another text, and in Unicode, up to the context window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.models import CORPUS, PROMPTS, peaked
from support.runs import TINY_MODEL, TINY_TWO_BLOCKS

from gpt.config.configs import SamplingConfig
from gpt.generation.sampling import generate
from gpt.models import hf
from gpt.models.export import load_export, save_export
from gpt.models.model import GPT, GPTConfig
from gpt.tokenizer.huggingface import hf_tokenizer
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer, Tokenizer
from gpt.tokenizer.ranks import ENDOFTEXT

transformers = pytest.importorskip("transformers")

@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No step may reach for the Hub: loads must work with it switched off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def compact() -> Tokenizer:
    return GPT2Tokenizer.fit([CORPUS])


def export(tmp_path: Path, config: GPTConfig, tokenizer: Tokenizer) -> tuple[GPT, Path]:
    model = peaked(config)
    save_export(model, tokenizer, tmp_path / "model")
    return model, tmp_path / "model"


@pytest.mark.parametrize("position", ["rope", "learned"])
@pytest.mark.parametrize("activation", ["relu2", "gelu"])
@pytest.mark.parametrize("bias", [False, True])
def test_every_model_option_loads_in_transformers_with_our_logits(tmp_path, position,
                                                                  activation, bias):  # fmt: skip
    tokenizer = CharTokenizer.fit([CORPUS])
    config = GPTConfig(**TINY_TWO_BLOCKS, position=position, activation=activation, bias=bias,
                       vocab_size=tokenizer.vocab_size)  # fmt: skip
    model, path = export(tmp_path, config, tokenizer)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert type(theirs).__name__ == ("GPTNeoXForCausalLM" if position == "rope"
                                     else "GPT2LMHeadModel")  # fmt: skip
    idx = torch.tensor([tokenizer.encode(CORPUS[:32])])
    with torch.no_grad():
        ours, _ = model(idx)
        assert torch.allclose(ours, theirs(idx).logits, atol=1e-4, rtol=0)
    # Our CLI reads the same directory back to the same model.
    again, tok = load_export(path)
    assert tok.to_json() == tokenizer.to_json()
    assert again.config == config
    with torch.no_grad():
        assert torch.equal(again(idx)[0], ours)


def our_greedy(model: GPT, tokenizer: Tokenizer, prompt: list[int], n: int) -> list[int]:
    cfg = SamplingConfig(temperature=0, max_new_tokens=n)
    return list(generate(model, prompt, cfg, stop_ids={tokenizer.eot_id},
                         vocab_size=tokenizer.vocab_size))  # fmt: skip


def test_the_default_model_and_tokenizer_agree_with_transformers_greedy(tmp_path):
    """The default architecture and the compact GPT-2 tokenizer, loaded by AutoModelForCausalLM
    and AutoTokenizer: same prompt ids, logits within 1e-4, and greedy replies equal token for
    token and as text, up to the context window; generation_config ends at end-of-text."""
    tokenizer = compact()
    config = GPTConfig(vocab_size=tokenizer.vocab_size)  # the default shape
    model, path = export(tmp_path, config, tokenizer)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(path)
    assert theirs.generation_config.eos_token_id == tokenizer.eot_id
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        assert their_tok(text)["input_ids"] == prompt, text
        n = config.block_size - len(prompt)  # up to the context window
        mine = our_greedy(model, tokenizer, prompt, n)
        with torch.no_grad():
            idx = torch.tensor([prompt + mine])
            assert torch.allclose(model(idx)[0], theirs(idx).logits, atol=1e-4, rtol=0)
            out = theirs.generate(idx[:, : len(prompt)], max_new_tokens=n, do_sample=False)
        reply = out[0, len(prompt):].tolist()
        if tokenizer.eot_id in reply:  # transformers keeps the end-of-text it stopped at
            reply = reply[: reply.index(tokenizer.eot_id)]
        assert reply == mine, text
        assert their_tok.decode(reply) == tokenizer.decode(mine)


def test_the_files_are_the_ecosystems(tmp_path):
    """config.json names a transformers architecture and no custom code; tokenizer.json is a
    `tokenizers` file with end-of-text special; the weights are stored once (tied)."""
    tokenizer = compact()
    config = GPTConfig(**TINY_MODEL, vocab_size=tokenizer.vocab_size)
    _, path = export(tmp_path, config, tokenizer)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["GPTNeoXForCausalLM"] and "auto_map" not in cfg
    assert cfg["vocab_size"] == tokenizer.vocab_size
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tokenizer.eot_id
    tok = json.loads((path / "tokenizer.json").read_text())
    assert {t["content"]: t["special"] for t in tok["added_tokens"]} == {"<|endoftext|>": True}
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
        assert f.get_tensor("gpt_neox.embed_in.weight").shape == (tokenizer.vocab_size,
                                                                    TINY_MODEL["n_embd"])


@pytest.mark.parametrize("position, kind", [("rope", "gpt2"), ("learned", "char")])
def test_the_files_load_as_the_ones_transformers_save_pretrained_writes(tmp_path, position,
                                                                        kind):  # fmt: skip
    """save_export writes the JSON itself (transformers is a 1.5 s import): loaded by
    transformers, its config, generation config and tokenizer are those that transformers' own
    classes, built from the same values, write with save_pretrained."""
    tokenizer = compact() if kind == "gpt2" else CharTokenizer.fit([CORPUS])
    config = GPTConfig(**TINY_MODEL, position=position, vocab_size=tokenizer.vocab_size)
    _, ours = export(tmp_path, config, tokenizer)
    theirs, eot = tmp_path / "theirs", tokenizer.eot_id
    config_class = {"rope": transformers.GPTNeoXConfig, "learned": transformers.GPT2Config}
    saved = config_class[position](**hf._config_keys(config, eot),
                                   architectures=[hf.architecture(config)], dtype="float32")
    saved.save_pretrained(theirs)
    transformers.GenerationConfig(bos_token_id=eot, eos_token_id=eot,
                                  pad_token_id=eot).save_pretrained(theirs)  # fmt: skip
    special = {} if eot is None else {"eos_token": ENDOFTEXT, "bos_token": ENDOFTEXT}
    transformers.PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tokenizer),
                                         model_max_length=config.block_size,
                                         **special).save_pretrained(theirs)  # fmt: skip

    def loaded(path: Path) -> tuple:
        cfg = transformers.AutoConfig.from_pretrained(path).to_dict()
        del cfg["_name_or_path"], cfg["transformers_version"]
        tok = transformers.AutoTokenizer.from_pretrained(path)
        return (cfg, transformers.GenerationConfig.from_pretrained(path).to_dict(), type(tok),
                tok.model_max_length, tok.special_tokens_map, tok.backend_tokenizer.to_str())

    assert loaded(ours) == loaded(theirs)


def test_a_model_in_the_earlier_format_gets_one_line_saying_what_to_do(tmp_path):
    """model/ as this project wrote it before (its own config keys): one line, no traceback."""
    from gpt.errors import InputError

    tokenizer = CharTokenizer("ab")
    config = GPTConfig(**TINY_MODEL, vocab_size=2)
    _, path = export(tmp_path, config, tokenizer)
    (path / "config.json").write_text(json.dumps({**TINY_MODEL, "vocab_size": 2}))
    with pytest.raises(InputError, match=r"earlier format, not a Hugging Face directory; run "):
        load_export(path)


@pytest.mark.parametrize("kind", ["char", "gpt2-full", "gpt2-capped"])
def test_every_tokenizer_option_loads_in_autotokenizer_with_our_ids(tmp_path, kind):
    """The tokenizers other than the default: characters, GPT-2's whole vocabulary, and a
    compact one that --max_vocab cut (its dropped tokens spelt by BPE over the kept ones)."""
    tokenizer = {"char": lambda: CharTokenizer.fit([CORPUS]), "gpt2-full": GPT2Tokenizer,
                 "gpt2-capped": lambda: GPT2Tokenizer.fit([CORPUS], max_vocab=600)}[kind]()
    config = GPTConfig(**TINY_MODEL, vocab_size=tokenizer.vocab_size)
    _, path = export(tmp_path, config, tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    texts = [CORPUS[:2000], PROMPTS[1]] + ([] if kind == "char" else PROMPTS[2:])
    for text in texts:
        ids = tokenizer.encode(text)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
