"""docs/stages.md's table of train-gpt's memory estimate (gpt/training/memory_estimate.py) per
GPT-2 size and training mode, per GPU: `python -m bench.memory_table` prints it, and
tests/test_docs.py holds the page to it. bfloat16 autocast and the chunked loss (a GPU's
defaults), context 1,024; the models are built on PyTorch's meta device (shapes, no memory).
"""

from __future__ import annotations

import torch

from bench.activation_memory import CONTEXT, SIZES, VOCAB
from gpt.config.configs import GPTConfig
from gpt.models.model import GPT
from gpt.training.memory_estimate import GiB, Plan, estimate

MODES = {  # column: the plan
    "full, micro-batch 1": Plan(1, 1, False),
    "full, micro-batch 8": Plan(8, 1, False),
    "checkpointed, micro-batch 8": Plan(8, 1, True),
    "LoRA rank 16, micro-batch 8": Plan(8, 1, False, lora_rank=16),
    "LoRA rank 16, checkpointed, micro-batch 8": Plan(8, 1, True, lora_rank=16),
    "sharded over 8 GPUs, micro-batch 8": Plan(8, 1, False, shards=8),
    "sharded over 8, checkpointed, micro-batch 8": Plan(8, 1, True, shards=8),
}


def table() -> str:
    lines = ["| size | parameters | " + " | ".join(MODES) + " |",
             "| --- | --- |" + " --- |" * len(MODES)]  # fmt: skip
    for size, (n_layer, n_head, n_embd) in SIZES.items():
        with torch.device("meta"):
            model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                                  block_size=CONTEXT, vocab_size=VOCAB))  # fmt: skip
        needs = [estimate(model, plan, bf16=True, chunked_loss=True, cuda=True).total
                 for plan in MODES.values()]
        cells = [f"{need / GiB:.1f} GiB" for need in needs]
        lines.append(f"| {size} | {model.num_params() / 1e6:,.0f}M | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
