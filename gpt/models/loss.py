"""The output head's loss in chunks of rows: the cross-entropy of `F.linear(x, weight, bias)`
without ever holding the whole float32 (N, V) logits.

At GPT-2's vocabulary the logits are a training iteration's largest tensors by far: at 64 x 1024
positions and 50,304 padded ids, the bfloat16 logits are 6.6 GB and their float32 copy (what
`F.cross_entropy` computes in under autocast), its log-softmax and their gradients 13.2 GB each.
Here each chunk of `rows` positions gets its logits, their log-sum-exp, its share of the loss and,
when a gradient is wanted, at once its gradient (softmax - one-hot): the gradients of `x` and
`weight` are summed chunk by chunk in the forward pass, as Liger Kernel's fused linear
cross-entropy does, so the backward only scales them by the loss's gradient and no logits are
computed twice. What stays is one chunk's logits (a GiB at most, `rows_per_chunk`), the
gradient of `x` (N, C) and of `weight` (V, C) in float32. Compiled, a chunk holds about two
float32 chunks' worth (Inductor keeps its bf16 logits, float32 probabilities and bf16 gradient
apart): less than the whole logits' 1.5 float32 (N, V) from two chunks on, more with one
(bench/speed_trials.md).

The arithmetic is `F.cross_entropy(F.linear(x, weight, bias).float(), targets, ignore_index)`'s,
also under autocast (the chunk's logits in the autocast type, then float32), summed in another
order: equal to 1e-6 in float32 (tests/workload/models/test_loss.py), not bit-equal, so the model
uses it where the logits are large and the CPU runs' bits need not stay as they were
(GPT.chunked_loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# A chunk's float32 logits take at most this many bytes (a GiB): at 50,304 ids, 4,096 rows
# (16 chunks at 64 x 1024 positions, 4 at 16 x 1024).
CHUNK_BYTES = 2**30


def rows_per_chunk(vocab: int) -> int:
    """The largest power of two of rows whose float32 logits fit CHUNK_BYTES (at least 1)."""
    rows = max(1, CHUNK_BYTES // (4 * vocab))
    return 1 << (rows.bit_length() - 1)


def _chunk(xc, weight, bias, yc, keep, scale, grad: bool):
    """One chunk of rows: its summed loss, and with `grad` the gradients of the loss's mean
    (`scale` = 1 / the count of kept rows) with respect to `xc` and `weight`. A function of its
    own so that the chunk's logits are freed before the next chunk's are computed."""
    low = F.linear(xc, weight, bias)  # (rows, V), in autocast's type if on
    compute, logits = low.dtype, low.float()  # compute: the type autograd's matmuls would run in
    del low
    picked = logits.gather(1, yc[:, None]).squeeze(1)  # (rows,)
    # log-sum-exp in place (torch.logsumexp would hold two more chunks): the chunk's one buffer
    # becomes exp(logits - max), then the softmax
    peak = logits.amax(dim=-1, keepdim=True)  # (rows, 1)
    exps = logits.sub_(peak).exp_()
    sums = exps.sum(dim=-1, keepdim=True)  # (rows, 1)
    lse = (peak + sums.log()).squeeze(1)  # (rows,)
    total = torch.where(keep, lse - picked, 0.0).sum()
    if not grad:
        return total, None, None
    # d loss / d logits = (softmax - one-hot) * scale, 0 on the rows left out
    probs = exps.div_(sums)
    probs.scatter_add_(1, yc[:, None], -torch.ones_like(probs[:, :1]))
    g = probs.mul_((keep * scale)[:, None]).to(compute)  # (rows, V)
    return total, g @ weight, g.t() @ xc  # autocast casts the matmuls as in F.linear's backward


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, targets, ignore_index: int, rows: int, grad: bool, chunk):
        valid = targets != ignore_index  # (N,)
        count = valid.sum()
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x) if grad else None  # (N, C)
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if grad else None  # (V, C)
        for start in range(0, x.size(0), rows):
            part = slice(start, start + rows)
            keep = valid[part]
            yc = torch.where(keep, targets[part], 0)  # an ignored row's target: any id
            loss, gx, gw = chunk(x[part], weight, bias, yc, keep, 1 / count, grad)
            total += loss
            if grad:
                grad_x[part] = gx
                grad_w += gw  # (V, C), summed in float32
        if grad:
            ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_loss.to(grad_x.dtype), (grad_w * grad_loss).to(ctx.weight_dtype),
                None, None, None, None, None, None)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, ignore_index: int = -100,
                         rows: int | None = None, chunk=None) -> torch.Tensor:
    """Mean cross-entropy of the logits `F.linear(x, weight, bias)` of `x` (N, C) against
    `targets` (N,), positions whose target is `ignore_index` left out, computed `rows`
    positions at a time (default `rows_per_chunk`). `bias` (V,) is a constant (no gradient):
    the model's padding mask, -inf on the ids no tokenizer emits. `chunk`: what computes a
    chunk, `_chunk`'s contract (default `_chunk`; --fused_loss: gpt/models/fused_loss.py's
    Triton kernel)."""
    if bias is not None and bias.requires_grad:
        raise ValueError("linear_cross_entropy: the bias must be a constant (no gradient)")
    rows = rows or rows_per_chunk(weight.size(0))
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(x, weight, bias, targets, ignore_index, rows, grad,
                                     chunk or _chunk)
