"""The Triton cross-entropy of --fused_loss (gpt/models/fused_loss.py), run by Triton's CPU
interpreter, against PyTorch's `F.cross_entropy`: the loss of each row and its gradient to 1e-5
in float32 (to a bfloat16 rounding of it in bfloat16), ignored ids and padding ids getting
none, over a vocabulary that spans several of the kernel's blocks with a ragged last one; and the
model trained with it as with the chunked loss in PyTorch's ops."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from support.runs import TINY_MODEL

import gpt.models
from gpt.config.configs import GPTConfig
from gpt.models.model import GPT

ROWS, VOCAB, PADDED = 37, 300, 320  # 300 ids over blocks of 128 columns: 128, 128, 44
BLOCK = 128
IGNORED = -100  # F.cross_entropy's default, which the model's losses use


def _triton_modules() -> dict[str, ModuleType]:
    """Triton's Python modules and ours (not its compiled extension, which loads once)."""
    return {name: module for name, module in sys.modules.items()
            if (name.split(".")[0] == "triton" and not name.startswith("triton._C"))
            or name == "gpt.models.fused_loss"}


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    """gpt.models.fused_loss, its kernel run by Triton's interpreter. Triton reads
    TRITON_INTERPRET=1 as it decorates each kernel, its own library's too, at import; and
    torch.compile imports Triton where it is installed, so a compiled test earlier in this
    process may have imported it without: the module is imported with a Triton of its own,
    and the process gets its own back after these tests."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the dev extra has it)")
    saved = _triton_modules()
    for name in saved:
        del sys.modules[name]
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRITON_INTERPRET", "1")
            module = importlib.import_module("gpt.models.fused_loss")
            patch.setattr(module, "MAX_BLOCK", BLOCK)
            yield module
    finally:
        ours = [sys.modules.pop(name) for name in _triton_modules()]
        sys.modules.update(saved)
        gpt.models.__dict__.pop("fused_loss", None)  # the package's name for the module
        for module in ours:  # as the interpreter's exit would: else Triton's extension,
            module.__dict__.clear()  # torn down first, reports its objects as leaked


def _logits(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (ROWS, PADDED), their padding columns -inf as the model's mask makes them, and
    targets with every fifth row ignored."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, PADDED, generator=g) * 4
    logits[:, VOCAB:] = float("-inf")
    targets = torch.randint(0, VOCAB, (ROWS,), generator=g)
    targets[::5] = IGNORED
    return logits.to(dtype), targets


def _reference(logits: torch.Tensor, targets: torch.Tensor):
    """F.cross_entropy's loss of each row (float32) and the gradient of their mean."""
    wanted = logits.float().requires_grad_()
    losses = F.cross_entropy(wanted, targets, reduction="none", ignore_index=IGNORED)
    (grad,) = torch.autograd.grad(losses.sum() / (targets != IGNORED).sum(), wanted)
    return losses.detach(), grad


def _kernel(fused: ModuleType, logits: torch.Tensor, targets: torch.Tensor, grad: bool):
    keep = targets != IGNORED
    ids = torch.where(keep, targets, 0)  # as linear_cross_entropy hands them over
    return fused.cross_entropy_rows(logits, ids, keep, 1 / keep.sum(), grad)


def test_float32_losses_and_gradient_equal_cross_entropy(fused: ModuleType) -> None:
    logits, targets = _logits()
    losses, grad = _reference(logits, targets)
    ours = logits.clone()
    torch.testing.assert_close(_kernel(fused, ours, targets, grad=True), losses,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, grad, atol=1e-5, rtol=1e-5)  # the logits became it
    assert torch.count_nonzero(ours[targets == IGNORED]) == 0  # ignored rows: no gradient
    assert torch.count_nonzero(ours[:, VOCAB:]) == 0  # padding ids: none either
    untouched = logits.clone()  # without a gradient: the same losses, the logits kept
    torch.testing.assert_close(_kernel(fused, untouched, targets, grad=False), losses,
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(untouched, logits)


def test_bfloat16_logits_get_float32_statistics(fused: ModuleType) -> None:
    """bf16 logits (autocast's): the loss in float32 as F.cross_entropy of their float32 copy,
    the gradient that float32 gradient rounded to bf16 (within one bf16 step)."""
    logits, targets = _logits(torch.bfloat16)
    losses, grad = _reference(logits, targets)
    ours = logits.clone()
    torch.testing.assert_close(_kernel(fused, ours, targets, grad=True), losses,
                               atol=1e-5, rtol=1e-5)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), grad.to(torch.bfloat16).float(),
                               atol=1e-6, rtol=2**-7)


def test_the_head_trains_as_the_chunked_loss_in_pytorch_ops(fused: ModuleType) -> None:
    """The model with --fused_loss: the same loss and gradients in every parameter (to 1e-5) as
    the chunked loss's PyTorch ops, padding rows none; evaluation's loss (no gradient) alike."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY_MODEL, "vocab_size": 67})).train()  # 67 ids, padded to 128
    idx, targets = torch.randint(0, 67, (2, 2, TINY_MODEL["block_size"]))
    targets[0, :3] = IGNORED

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logits, loss = model(idx, targets=targets)
        assert logits is None
        (loss * 3.0).backward()  # a loss gradient other than 1
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    model.chunked_loss = True
    loss, grads = loss_and_grads()
    model.fused_loss = True
    fused_loss, fused_grads = loss_and_grads()
    torch.testing.assert_close(fused_loss, loss, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
    assert torch.count_nonzero(model.lm_head.weight.grad[67:]) == 0
    with torch.no_grad():
        torch.testing.assert_close(model(idx, targets=targets)[1], loss, atol=1e-5, rtol=1e-5)


def test_under_autocast_the_head_computes_as_the_chunked_loss_does(fused: ModuleType) -> None:
    """bf16 autocast (a GPU's training): the weight cast once for all chunks gives the very loss
    and gradients of autocast's cast before each matmul; they are the chunked loss's PyTorch
    ops' up to bf16 rounding (the logits' gradients, float32 in both, may round to bf16 a step
    apart), and the weight's gradient is float32."""
    from gpt.models.loss import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, 24, generator=g, requires_grad=True)
    weight = (torch.randn(PADDED, 24, generator=g) * 0.5).requires_grad_()
    _, targets = _logits()
    mask = F.pad(torch.zeros(VOCAB), (0, PADDED - VOCAB), value=float("-inf"))

    def cast_each_time(*args, **kwargs):
        return linear_cross_entropy(*args, **kwargs, chunk=fused._fused_chunk)

    found = []
    for loss_of in (fused.fused_linear_cross_entropy, cast_each_time, linear_cross_entropy):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(x, weight, mask, targets, rows=16)  # 37 rows: 3 chunks
        found.append((loss, *torch.autograd.grad(loss, (x, weight))))
    (ours, *grads), (each_time, *each_grads), (chunked, *chunked_grads) = found
    assert torch.equal(ours, each_time)
    assert all(torch.equal(a, b) for a, b in zip(grads, each_grads, strict=True))
    assert grads[1].dtype == torch.float32
    torch.testing.assert_close(ours, chunked, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, chunked_grads, strict=True):  # two bf16 steps of the largest
        torch.testing.assert_close(a, b, atol=b.abs().max().item() * 2**-6, rtol=0)
