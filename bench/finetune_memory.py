"""Fine-tuning GPT-2's sizes on one GPU: peak memory and tokens/s per size and mode (full
training, activation checkpointing, LoRA adapters of rank 16 on every projection), against
train-gpt's estimate (gpt/training/memory_estimate.py), in one call of the GPU session
(bench/gpu_session.sh).

Each case runs in a process of its own, so an out-of-memory case ends alone and each peak is
its own: the model at GPT-2's real shape with random weights (no download), train-gpt's AdamW
(gpt/training/optimizer.py), bfloat16 autocast and the chunked loss (a GPU's defaults), eager
(a compile per case would take the call's minutes), `MICRO_BATCH` sequences of 1,024 tokens.
Three iterations warm up, then `ITERATIONS` are timed; the peak is the allocator's over all of
them (torch.cuda.max_memory_allocated), and what the allocator reserved beside it. Each row is
appended to `<results>/finetune_memory.jsonl` as it ends, so a call cut short keeps what it
measured. Needs CUDA; on a CPU it says so and measures nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.activation_memory import CONTEXT, SIZES, VOCAB
from bench.harness import RESULTS, Result, case_main, own_process

MODES = ("full", "activation checkpointing", "LoRA")
LORA_RANK = 16
MICRO_BATCH, WARMUP, ITERATIONS = 8, 3, 10
CASE_LIMIT_S = 150  # a case that has not ended by then is stopped (its row says so)


def measure(size: str, mode: str) -> dict[str, Any]:
    """One case, in this process: peak memory, tokens/s and the estimate."""
    import torch

    from gpt.config.configs import LORA_TARGETS, GPTConfig, TrainConfig
    from gpt.models import lora
    from gpt.models.model import GPT
    from gpt.training.memory_estimate import Plan, estimate
    from gpt.training.optimizer import build_optimizer

    device = torch.device("cuda")
    n_layer, n_head, n_embd = SIZES[size]
    torch.manual_seed(0)
    with device:
        model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                              block_size=CONTEXT, vocab_size=VOCAB, dropout=0.0))  # fmt: skip
    model.chunked_loss = True
    model.activation_checkpointing = mode == "activation checkpointing"
    if mode == "LoRA":  # the frozen weights are these random ones: the memory is the same
        lora.add_adapters(model, LORA_RANK, 16.0, list(LORA_TARGETS))
    model.train()
    optimizer = build_optimizer(model, TrainConfig(), device)
    batches = torch.randint(0, VOCAB, (WARMUP + ITERATIONS, 2, MICRO_BATCH, CONTEXT),
                            device=device)  # fmt: skip

    def iteration(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    for x, y in batches[:WARMUP]:
        iteration(x, y)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in batches[WARMUP:]:
        iteration(x, y)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    plan = Plan(MICRO_BATCH, 1, model.activation_checkpointing,
                lora_rank=LORA_RANK if mode == "LoRA" else 0)
    need = estimate(model, plan, bf16=True, chunked_loss=True, cuda=True)
    return {"peak_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": torch.cuda.max_memory_reserved(),
            "estimate_bytes": need.total, "estimate_parts": need.parts(),
            "tokens_per_s": ITERATIONS * MICRO_BATCH * CONTEXT / seconds}  # fmt: skip


def case(size: str, mode: str) -> dict[str, Any]:
    """`measure` in a process of its own; an error or the limit is the row's `error`."""
    return own_process("bench.finetune_memory", size, mode, limit_s=CASE_LIMIT_S)


def run(quick: bool, results: Path = RESULTS) -> Result:
    import torch

    sizes = list(SIZES)[:2] if quick else list(SIZES)
    result = Result(
        "finetune_memory",
        {"micro_batch": MICRO_BATCH, "context": CONTEXT, "dtype": "bfloat16 autocast",
         "loss": "chunked", "compiled": False, "iterations": ITERATIONS, "warmup": WARMUP},
        ["size", "mode", "peak", "estimate", "estimate / peak", "tokens/s"],
    )
    if not torch.cuda.is_available():
        print("finetune_memory: no CUDA device here; it measures a GPU (bench/gpu_session.sh)")
        return result
    rows = results / "finetune_memory.jsonl"
    results.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        for mode in MODES:
            row = {"size": size, "mode": mode, **case(size, mode)}
            if "error" not in row:
                row |= {"peak": f"{row['peak_bytes'] / 2**30:.1f} GiB",
                        "estimate": f"{row['estimate_bytes'] / 2**30:.1f} GiB",
                        "estimate / peak": f"{row['estimate_bytes'] / row['peak_bytes']:.2f}",
                        "tokens/s": f"{row['tokens_per_s']:,.0f}"}  # fmt: skip
            else:
                row |= {"peak": row["error"]}
            print(f"finetune_memory: {json.dumps(row)}", flush=True)
            with rows.open("a") as f:
                f.write(json.dumps(row) + "\n")
            result.rows.append(row)
    return result


if __name__ == "__main__":
    case_main(measure, "bench/finetune_memory.py", size=SIZES, mode=MODES)
