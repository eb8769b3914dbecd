"""train-gpt's memory estimate (gpt/training/memory_estimate.py, said before training and the
ground of its refusals) against the peak memory training measured on a CPU at small sizes.

Each case runs in a process of its own: it imports torch, notes its resident memory, then builds
the model and AdamW as train-gpt does and trains two iterations (the second one's peak is the
steady one: AdamW's moments exist from the first step on), its resident memory sampled every
half millisecond from before the model is built (bench/step_memory.py's PeakRSS). The measured
peak above that starting point is what the estimate claims to count, and a few hundred MB more
that the runtime takes whatever the model (thread pools, kernels' first use): at sizes where
the model's own memory is most of the peak. float32, eager, the whole
logits: a CPU's run. On a GPU, bench/finetune_memory.py measures the allocator's peak.
"""

from __future__ import annotations

from typing import Any

from bench.harness import Result, case_main, own_process

VOCAB = 50257
SHAPES = {  # (n_layer, n_head, n_embd, block_size, micro_batch)
    "4 x 256, 8 x 256": (4, 4, 256, 256, 8),
    "8 x 384, 4 x 512": (8, 6, 384, 512, 4),
}
MODES = ("full", "activation checkpointing")


def measure(shape: str, mode: str) -> dict[str, Any]:
    """The peak resident memory above the start of one case, with the estimate (this process)."""
    import torch

    from bench.step_memory import PeakRSS
    from gpt.config.configs import GPTConfig
    from gpt.models.model import GPT
    from gpt.training.memory_estimate import Plan, estimate

    torch.manual_seed(0)
    torch.set_num_threads(1)
    n_layer, n_head, n_embd, block_size, micro_batch = SHAPES[shape]
    checkpointed = mode == "activation checkpointing"
    batches = torch.randint(0, VOCAB, (2, 2, micro_batch, block_size))
    sampler = PeakRSS()
    before = sampler.rss()
    sampler.start()
    model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                          vocab_size=VOCAB, dropout=0.0)).train()  # fmt: skip
    model.activation_checkpointing = checkpointed
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    sampler.done.set()
    sampler.join()
    need = estimate(model, Plan(micro_batch, 1, checkpointed), bf16=False, chunked_loss=False,
                    cuda=False)  # fmt: skip
    return {"peak_bytes": sampler.peak - before, "estimate_bytes": need.total,
            "estimate": need.parts()}  # fmt: skip


def case(shape: str, mode: str) -> dict[str, Any]:
    """`measure` in a fresh process: nothing an earlier case freed is there to reuse."""
    row = own_process("bench.memory_peaks", shape, mode)
    if "error" in row:
        raise RuntimeError(f"memory_peaks {shape}, {mode}: {row['error']}")
    return row


def run(quick: bool) -> Result:
    shapes = list(SHAPES)[:1] if quick else list(SHAPES)
    result = Result(
        "memory_peaks",
        {"device": "cpu", "dtype": "float32", "vocab": VOCAB, "iterations": 2,
         "measured": "peak resident memory above the process's before the model is built"},
        ["shape", "mode", "measured peak", "estimate", "estimate / measured"],
    )
    for shape in shapes:
        for mode in MODES:
            row = case(shape, mode)
            result.rows.append({
                "shape": shape, "mode": mode,
                "measured peak": f"{row['peak_bytes'] / 2**20:,.0f} MiB",
                "estimate": f"{row['estimate_bytes'] / 2**20:,.0f} MiB",
                "estimate_parts": row.pop("estimate"),
                "estimate / measured": f"{row['estimate_bytes'] / row['peak_bytes']:.2f}",
                **row,
            })  # fmt: skip
    return result


if __name__ == "__main__":
    case_main(measure, "bench/memory_peaks.py", shape=SHAPES, mode=MODES)
