"""LoRA's adapters on our GPT (gpt/models/lora.py): the model starts as the one adapted, only
the adapters train, and the adapters leave as PEFT's files that `peft.PeftModel` loads onto
transformers' model of the start, GPT-NeoX's (c_attn regrouped per head) and GPT-2's (Conv1D),
with the logits of the merged export."""

from __future__ import annotations

import json

import peft
import pytest
import torch
import transformers
from support.models import CORPUS, peaked
from support.runs import TINY_TWO_BLOCKS

from gpt.config.configs import LORA_TARGETS
from gpt.models import lora
from gpt.models.export import save_export
from gpt.models.model import GPT, GPTConfig
from gpt.tokenizer.kinds import CharTokenizer


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def adapted(position: str, targets: tuple[str, ...] = LORA_TARGETS) -> tuple[GPT, GPT]:
    """A model of `position`, and a copy of it with rank-4 adapters on `targets`."""
    tokenizer = CharTokenizer.fit([CORPUS])
    config = GPTConfig(**TINY_TWO_BLOCKS, position=position, bias=True,
                       activation="gelu_new", vocab_size=tokenizer.vocab_size)  # fmt: skip
    base = peaked(config)
    model = peaked(config)
    return base, lora.add_adapters(model, rank=4, alpha=8.0, targets=list(targets))


def test_adapters_start_at_zero_and_train_alone():
    base, model = adapted("rope")
    idx = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(model(idx)[0], base(idx)[0])  # B starts at zero: the model unchanged
    adapters = lora.adapter_weights(model)
    # A and B on each of the 4 projections of each of the 2 blocks, and nothing else trains
    assert len(adapters) == 2 * 4 * 2
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == set(adapters)
    assert model.num_trained_params() == sum(t.numel() for t in adapters.values())
    assert f"{model.num_trained_params():,} of them trained" in model.describe()
    model.train()
    model(idx, targets=idx)[1].backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads) == set(adapters)
    # B's gradient moves it first; A's is zero while B is (it reaches A through B)
    assert all(bool(g.any()) == (".lora_B." in n) for n, g in grads.items())


def test_loading_adapters_that_do_not_fit_is_refused():
    _, model = adapted("rope", ("attn.c_attn",))
    saved = lora.adapter_weights(model)
    lora.load_adapters(model, saved)
    with pytest.raises(ValueError, match=r"mlp\.c_fc\.lora_A\.default\.weight is no adapter"):
        lora.load_adapters(model, {**saved, "transformer.h.0.mlp.c_fc.lora_A.default.weight":
                                   torch.zeros(4, 32)})  # fmt: skip
    name = next(iter(saved))
    with pytest.raises(ValueError, match="missing"):
        lora.load_adapters(model, {k: v for k, v in saved.items() if k != name})


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_peft_loads_the_adapters_onto_the_starts_transformers_model(tmp_path, position):
    """GPT-NeoX for rotary positions (its query_key_value rows per head), GPT-2 for learned
    (Conv1D: fan_in_fan_out): the start's model with PEFT's adapters computes the merged
    export's logits, and they are not the start's."""
    base, model = adapted(position)
    tokenizer = CharTokenizer.fit([CORPUS])
    with torch.no_grad():  # adapters far from zero, every row of them different
        for name, p in model.named_parameters():
            if lora.is_adapter(name):
                p.normal_(0.0, 0.3)
    save_export(base, tokenizer, tmp_path / "start")
    save_export(model, tokenizer, tmp_path / "merged")
    lora.save_adapters(model, model.config, tmp_path / "adapter", str(tmp_path / "start"), None)
    config = json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "start")
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)

    start = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "start").eval()
    tuned = peft.PeftModel.from_pretrained(start, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    idx = torch.tensor([tokenizer.encode(CORPUS[:32])])
    with torch.no_grad():
        theirs, want = tuned(idx).logits, merged(idx).logits
        assert torch.allclose(theirs, want, atol=1e-4, rtol=0)
        assert torch.allclose(model(idx)[0], want, atol=1e-4, rtol=0)
        with tuned.disable_adapter():  # the start's own logits
            assert (tuned(idx).logits - theirs).abs().max() > 0.1
