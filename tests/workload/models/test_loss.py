"""The chunked output-head loss (gpt/models/loss.py) against `F.cross_entropy` of the whole logits:
loss and gradients to 1e-6, with ignored targets and padding ids, under autocast, and how much
memory it saves."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from gpt.models.loss import CHUNK_BYTES, linear_cross_entropy, rows_per_chunk

N, C, V, VOCAB = 100, 24, 128, 67  # rows, width, padded vocabulary, real ids (67 -> 128)


def _inputs(seed: int = 0, ignored: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g, requires_grad=True)
    weight = (torch.randn(V, C, generator=g) * 0.5).requires_grad_()
    targets = torch.randint(0, VOCAB, (N,), generator=g)
    targets[torch.randperm(N, generator=g)[:ignored]] = -100
    return x, weight, targets


def _padding_mask() -> torch.Tensor:
    return F.pad(torch.zeros(VOCAB), (0, V - VOCAB), value=float("-inf"))  # as GPT's logit_mask


def _grads(loss, x, weight):
    return torch.autograd.grad(loss * 3.0, (x, weight))  # a loss gradient other than 1


@pytest.mark.parametrize("ignored", [0, 17])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 32, N, 1000])
def test_loss_and_gradients_equal_cross_entropy_of_the_whole_logits(ignored, padded, rows):
    x, weight, targets = _inputs(ignored=ignored)
    bias = _padding_mask() if padded else None
    reference = F.cross_entropy(F.linear(x, weight, bias).float(), targets)
    chunked = linear_cross_entropy(x, weight, bias, targets, rows=rows)
    torch.testing.assert_close(chunked, reference, atol=1e-6, rtol=1e-6)
    grad_x, grad_w = _grads(chunked, x, weight)
    for ours, theirs in zip((grad_x, grad_w), _grads(reference, x, weight), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    if padded:  # the padding rows get no gradient, as from the whole logits
        assert torch.count_nonzero(grad_w[VOCAB:]) == 0
    if ignored:  # an ignored position's input gets no gradient
        assert torch.count_nonzero(grad_x[targets == -100]) == 0


def test_another_ignore_index_and_no_gradient_wanted():
    x, weight, targets = _inputs(ignored=9)
    targets[targets == -100] = 5  # a real id, ignored
    reference = F.cross_entropy(x @ weight.t(), targets, ignore_index=5)
    torch.testing.assert_close(linear_cross_entropy(x, weight, None, targets, ignore_index=5,
                                                    rows=16), reference, atol=1e-6, rtol=1e-6)
    with torch.no_grad():  # evaluation: the loss alone, no gradient kept
        loss = linear_cross_entropy(x, weight, None, targets, rows=16)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, F.cross_entropy(x @ weight.t(), targets).detach(),
                               atol=1e-6, rtol=1e-6)


def test_under_bf16_autocast_it_computes_what_cross_entropy_of_bf16_logits_does():
    """Autocast: the chunk's logits in bfloat16, then float32, as `F.cross_entropy(lm_head(x)
    .float())` takes them; the gradients in bfloat16 matmuls, summed in float32 over chunks
    (autograd rounds the whole weight gradient to bfloat16 once: a bfloat16 ulp apart)."""
    x, weight, targets = _inputs(ignored=5)
    bias = _padding_mask()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.cross_entropy(F.linear(x, weight, bias).float(), targets)
        chunked = linear_cross_entropy(x, weight, bias, targets, rows=32)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, reference, atol=1e-6, rtol=1e-6)
    ours, theirs = _grads(chunked, x, weight), _grads(reference, x, weight)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=1e-3, rtol=2**-7)


def test_a_bias_with_a_gradient_is_refused():
    x, weight, targets = _inputs()
    with pytest.raises(ValueError, match="bias must be a constant"):
        linear_cross_entropy(x, weight, torch.zeros(V, requires_grad=True), targets)


def test_chunks_hold_at_most_a_gib_of_float32_logits():
    assert rows_per_chunk(50304) == 4096  # GPT-2's padded vocabulary
    for vocab in (1, 128, 50304, 2**31):
        rows = rows_per_chunk(vocab)
        assert rows >= 1 and rows & (rows - 1) == 0
        assert rows * vocab * 4 <= CHUNK_BYTES or rows == 1


# One forward and backward of the head at a vocabulary-dominated shape, in a fresh process: its
# peak resident memory above what it held before (glibc serves tensors this large with mmap, so
# the peak counts them and only them). The peak is VmHWM, its own address space's: ru_maxrss
# would start from the test process's (the kernel keeps the high-water mark of the address
# space exec replaces: fs/exec.c), and a pytest worker grown past 1 GB hid most of it.
_PEAK = """
import sys, torch, torch.nn.functional as F
from gpt.models.loss import linear_cross_entropy

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024

torch.manual_seed(0)
rows, width, vocab = 4096, 64, 50304
x = torch.randn(rows, width, requires_grad=True)
w = (torch.randn(vocab, width) * 0.02).requires_grad_()
y = torch.randint(0, vocab, (rows,))
before = peak()
if sys.argv[1] == "chunked":
    loss = linear_cross_entropy(x, w, None, y, rows=1024)
else:
    loss = F.cross_entropy(F.linear(x, w), y)
loss.backward()
print(peak() - before)
"""


def _peak_bytes(kind: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PEAK, kind], capture_output=True, text=True,
                         check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return int(out.stdout)


@pytest.mark.process
def test_the_chunked_head_never_holds_the_whole_logits():
    """4,096 positions x 50,304 ids: the whole float32 logits are 0.82 GB, and `F.cross_entropy`
    holds three such tensors at its peak (measured: 2.5 GB); the chunked head one chunk's (1,024
    rows: 206 MB) and the two gradients (1 + 13 MB; measured: 0.26 GB, as at 8,192 positions)."""
    logits, chunk = 4096 * 50304 * 4, 1024 * 50304 * 4
    whole, chunked = _peak_bytes("whole"), _peak_bytes("chunked")
    # (Measured bounds, not the arithmetic's: a busy machine's kernel may keep fewer pages
    # resident at the peak; 3.8 GB once.)
    assert whole > 1.5 * logits  # more than one whole logits at once
    assert chunked < 1.5 * chunk  # one chunk's logits at a time, not two
