"""The chunked loss's cross-entropy as one Triton kernel (train-gpt's --fused_loss): for each row
of a chunk's logits, the float32 log-sum-exp, the row's loss and, in the same kernel, its
gradient (softmax - one-hot) / the count of kept rows, written over the logits it was computed
from.

llm.c's `fused_classifier` is the model: one program per row reads the row's logits block by
block twice, once for the running maximum and sum of exponentials (the online softmax), once
to write the gradient in place. What the chunk holds is its logits in autocast's type (bf16 on a
GPU) and one float32 loss a row: no float32 copy of the logits, no float32 softmax, no second
(rows, V) tensor for the gradient. PyTorch's ops in `gpt.models.loss._chunk` make the float32
copy, the softmax in it and a bf16 gradient beside it, which Inductor fuses into fewer passes but
not into one. The rest, the chunks and the matmuls of the gradients, is
`gpt.models.loss.linear_cross_entropy`'s; the arithmetic is the same (float32 statistics,
the gradient rounded once to the logits' type), summed in another order.

Triton runs on CUDA; on a CPU only under its interpreter (TRITON_INTERPRET=1, set before this
module is imported), which is how the tests check the kernel against `F.cross_entropy`.
Imported only where --fused_loss is on: the workload's CPU image has no Triton.
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpt.models.loss import linear_cross_entropy

# Columns a program reads at once, and its warps: Liger Kernel's cross-entropy choice (at most
# 32,768 columns, 32 warps), which keeps a GPT-2 row (50,304 ids) to two blocks a pass.
MAX_BLOCK = 32768
WARPS = 32


def interpreted() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _cross_entropy_rows(logits_ptr, row_stride, targets_ptr, keep_ptr, scale_ptr, losses_ptr,
                        n_cols, GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """One row: its loss into losses_ptr[row]; with GRAD, its logits replaced by the loss's
    gradient (softmax - one-hot) * scale, 0 where the row is not kept."""
    row = tl.program_id(0).to(tl.int64)
    logits_ptr += row * row_stride
    target = tl.load(targets_ptr + row)
    keep = tl.load(keep_ptr + row)
    # the online softmax: a running maximum, and the sum of exponentials relative to it
    peak = float("-inf")
    total = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_peak = tl.maximum(peak, tl.max(x, axis=0))
        total = total * tl.exp(peak - new_peak) + tl.sum(tl.exp(x - new_peak), axis=0)
        peak = new_peak
    lse = peak + tl.log(total)
    picked = tl.load(logits_ptr + target).to(tl.float32)
    tl.store(losses_ptr + row, tl.where(keep, lse - picked, 0.0))
    if GRAD:
        scale = tl.where(keep, tl.load(scale_ptr), 0.0)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(logits_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)
            tl.store(logits_ptr + cols, (grad * scale).to(logits_ptr.dtype.element_ty),
                     mask=cols < n_cols)


def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor,
                       scale: torch.Tensor, grad: bool) -> torch.Tensor:
    """The float32 loss of each row of `logits` (rows, V) against `targets` (rows,), 0 where
    `keep` (rows,) is False (their targets must still be ids, any); with `grad`, `logits`
    becomes d(loss's sum) / d logits times `scale` (a 0-d float32 tensor: 1 / the count of kept
    rows), in its own type. Padding ids (a -inf logit) get probability 0 and gradient 0."""
    if logits.device.type != "cuda" and not interpreted():
        raise RuntimeError(f"cross_entropy_rows: Triton runs on CUDA, not {logits.device.type} "
                           "(or set TRITON_INTERPRET=1 before importing it, for tests)")
    rows, n_cols = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("cross_entropy_rows: the logits' columns must be contiguous")
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    block = min(MAX_BLOCK, triton.next_power_of_2(n_cols))
    _cross_entropy_rows[(rows,)](logits, logits.stride(0), targets, keep,
                                 scale.to(torch.float32), losses, n_cols, GRAD=grad,
                                 BLOCK=block, num_warps=WARPS)
    return losses


def _fused_chunk(xc, weight, bias, yc, keep, scale, grad: bool, low=None):
    """`gpt.models.loss._chunk`'s contract (the chunk's summed loss, and with `grad` the
    gradients of the loss's mean with respect to `xc` and `weight`), its cross-entropy in one
    kernel that turns the chunk's logits into their gradient. `low`: `weight` already in
    autocast's type, for the matmuls (else autocast casts it again for each)."""
    w = weight if low is None else low
    logits = F.linear(xc, w, bias)  # (rows, V), in autocast's type if on
    total = cross_entropy_rows(logits, yc, keep, scale, grad).sum()
    if not grad:
        return total, None, None
    return total, logits @ w, logits.t() @ xc  # autocast casts as F.linear's backward


@torch.compiler.disable  # the head runs eagerly: Dynamo need not trace a user Triton kernel
def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               targets: torch.Tensor, ignore_index: int = -100,
                               rows: int | None = None) -> torch.Tensor:
    """`gpt.models.loss.linear_cross_entropy` with each chunk's cross-entropy in one Triton
    kernel: the mean cross-entropy of `F.linear(x, weight, bias)` against `targets`."""
    low = None
    device = x.device.type
    if torch.is_autocast_enabled(device) and weight.dtype != torch.get_autocast_dtype(device):
        # Cast once, not twice a chunk: autocast caches the casts of leaf tensors only, and
        # the spelled embedding is none. The gradient still goes to `weight`, in float32.
        low = weight.detach().to(torch.get_autocast_dtype(device))
    return linear_cross_entropy(x, weight, bias, targets, ignore_index, rows,
                                chunk=partial(_fused_chunk, low=low))
