"""--activation_checkpointing (GPT.activation_checkpointing): each block's insides computed again
in backward, with the loss and gradients of the plain forward, dropout's masks included; a
train-gpt run with it trains as one without; the memory estimate counts what it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.runs import TINY, TINY_TWO_BLOCKS, as_flags, records, train, write_data

from gpt.config.configs import GPTConfig
from gpt.models.model import GPT
from gpt.rundir.layout import RunDir


def _loss_and_grads(model: GPT, idx: torch.Tensor, targets: torch.Tensor, checkpointed: bool):
    model.activation_checkpointing = checkpointed
    torch.manual_seed(1)  # the same dropout draws for both
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_checkpointed_blocks_give_the_plain_forwards_loss_and_gradients(position):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY_TWO_BLOCKS, "n_layer": 3, "dropout": 0.2,
                             "position": position})).train()  # fmt: skip
    idx = torch.randint(0, model.config.vocab_size, (4, 32))
    targets = torch.randint(0, model.config.vocab_size, (4, 32))
    plain_loss, plain = _loss_and_grads(model, idx, targets, checkpointed=False)
    loss, grads = _loss_and_grads(model, idx, targets, checkpointed=True)
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    assert grads.keys() == plain.keys()
    for name, grad in grads.items():  # the same ops again: float32 rounding at most
        torch.testing.assert_close(grad, plain[name], msg=name)


def test_without_gradients_nothing_is_recomputed_and_generation_is_unchanged():
    """Evaluation and the prompt stage run under no_grad with a KV cache: the plain blocks."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY_TWO_BLOCKS)).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 8))
    with torch.no_grad():
        plain, _ = model(idx)
        model.activation_checkpointing = True
        cache = model.new_cache(2)
        cached, _ = model(idx, cache=cache)
        again, _ = model(idx)
    torch.testing.assert_close(cached, plain, rtol=0, atol=0)
    torch.testing.assert_close(again, plain, rtol=0, atol=0)


def test_a_run_with_it_trains_as_one_without(tmp_path: Path) -> None:
    flags = as_flags({**TINY, "n_layer": 2, "max_iters": 6, "eval_interval": 3})
    for run, extra in (("plain", []), ("checkpointed", ["--activation_checkpointing", "true"])):
        write_data(tmp_path, run)
        assert train(tmp_path, run, *flags, *extra) == 0
    plain, checkpointed = (records(RunDir.of(tmp_path, r)) for r in ("plain", "checkpointed"))
    assert [r["step"] for r in checkpointed] == [r["step"] for r in plain]
    for a, b in zip(plain, checkpointed, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), a["step"]


def test_it_keeps_a_fraction_of_what_the_plain_forward_saves_for_backward():
    """Measured as bench/activation_memory.py measures it: every tensor autograd saves."""
    from bench.activation_memory import saved_bytes

    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY_TWO_BLOCKS, "n_layer": 6, "n_embd": 64,
                             "vocab_size": 64})).train()  # the blocks' activations, not logits
    idx = torch.randint(0, model.config.vocab_size, (4, 32))
    plain = saved_bytes(model, idx)
    model.activation_checkpointing = True
    assert saved_bytes(model, idx) < plain / 3
