"""Sampling: tokens/s and first-token latency with the KV cache and without it.

The model has the demo's shape (nanoGPT's shakespeare_char: 6 layers, 6 heads, 384 wide, a
256-token window, 65 characters) with random weights: speed does not depend on what it learned.
Greedy decoding, so both paths do the same work token for token.
"""

from __future__ import annotations

import torch

from bench.harness import Result, Stats, fmt_stats
from gpt.model import GPT, GPTConfig
from gpt.sampling import measure_speed

CONFIG = GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)
# (prompt tokens, new tokens): a short prompt inside the window; a long reply that slides it
CASES = [(16, 200), (16, 600)]


def run(quick: bool) -> Result:
    repeats = 1 if quick else 3
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(CONFIG).to(device).eval()
    cases = CASES[:1] if quick else CASES
    result = Result(
        "sampling",
        {"model": vars(CONFIG), "device": device, "repeats": repeats, "warmup": 1},
        ["prompt", "new tokens", "cache", "tokens/s", "first token", "speed-up"],
    )
    for prompt_len, new in cases:
        prompt = torch.randint(0, CONFIG.vocab_size, (prompt_len,)).tolist()
        rates: dict[bool, Stats] = {}
        for use_cache in (False, True):
            measure_speed(model, prompt, 8, use_cache)  # warm-up: allocator, kernels
            runs = [measure_speed(model, prompt, new, use_cache) for _ in range(repeats)]
            rates[use_cache] = Stats([r.tokens_per_s for r in runs])
            first = Stats([r.first_token_s * 1e3 for r in runs])
            result.rows.append(
                {
                    "prompt": prompt_len,
                    "new tokens": new,
                    "cache": use_cache,
                    "tokens/s": fmt_stats(rates[use_cache]),
                    "first token": fmt_stats(first, " ms"),
                    "speed-up": (
                        f"{rates[True].median / rates[False].median:.1f}x" if use_cache else ""
                    ),
                    "tokens_per_s": rates[use_cache].as_dict(),
                    "first_token_ms": first.as_dict(),
                }
            )
    return result
