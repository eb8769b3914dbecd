"""Activation memory: what one sequence of 1,024 tokens keeps for the backward pass in each GPT-2
size, with and without --activation_checkpointing, against train-gpt's estimate
(gpt/training/memory_estimate.py, which refuses a run that cannot fit).

Measured exactly and on any machine: the model is built on PyTorch's meta device (shapes, no
storage: GPT-2 XL's forward takes a second) with random weights of the real shapes, and every
tensor autograd saves for backward passes through a saved-tensors hook that adds up its bytes.
What is saved is what the CPU's kernels save (attention's math path keeps its (T, T) weights,
float32); CUDA's flash attention keeps less, which the estimate's `cuda=True` counts. The
weights, gradients and AdamW's state come on top, in both modes.
"""

from __future__ import annotations

import torch

from bench.harness import Result
from gpt.config.configs import GPTConfig
from gpt.models.model import GPT
from gpt.training.memory_estimate import Plan, estimate

# GPT-2's sizes (n_layer, n_head, n_embd), context 1,024, vocabulary 50,257.
SIZES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
         "gpt2-xl": (48, 25, 1600)}  # fmt: skip
CONTEXT, VOCAB, SEQUENCES = 1024, 50257, 1


def saved_bytes(model: GPT, idx: torch.Tensor) -> int:
    """The bytes of every tensor the training forward of `idx` (as its own targets) saves for
    backward."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return sum(saved.values())


def run(quick: bool) -> Result:
    sizes = list(SIZES)[:2] if quick else list(SIZES)
    result = Result(
        "activation_memory",
        {"sequences": SEQUENCES, "context": CONTEXT, "dtype": "float32",
         "measured": "bytes saved for backward, meta device (the CPU's kernels)"},  # fmt: skip
        ["size", "mode", "saved for backward", "estimate", "of the plain forward's"],
    )
    for size in sizes:
        n_layer, n_head, n_embd = SIZES[size]
        with torch.device("meta"):
            model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                                  block_size=CONTEXT, vocab_size=VOCAB)).train()  # fmt: skip
            idx = torch.zeros(SEQUENCES, CONTEXT, dtype=torch.long)
        plain = 0
        for mode in ("plain", "checkpointed"):
            model.activation_checkpointing = mode == "checkpointed"
            saved = saved_bytes(model, idx)
            plain = plain or saved
            need = estimate(model, Plan(SEQUENCES, 1, mode != "plain"), bf16=False,
                            chunked_loss=False, cuda=False)
            # of the three logits copies the estimate counts at the peak, the one saved for
            # backward (cross-entropy's log-softmax)
            estimate_bytes = need.activations + need.logits // 3
            result.rows.append({
                "size": size, "mode": mode, "saved for backward": f"{saved / 2**20:,.0f} MiB",
                "estimate": f"{estimate_bytes / 2**20:,.0f} MiB",
                "of the plain forward's": f"{saved / plain:.0%}",
                "saved_bytes": saved, "estimate_bytes": estimate_bytes,
            })  # fmt: skip
    return result
