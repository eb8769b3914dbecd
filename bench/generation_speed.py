"""Generation: tokens/s and first-token latency for 256 new tokens, with and without the KV cache.

The model has the default shape of `python -m gpt train-gpt` and the vocabulary of the default
corpus, with random weights: speed does not depend on what the model learned. Greedy decoding
of exactly 256 tokens (`gpt.sampling.measure_speed`), so both paths do the same work token for
token. The prompt is the first 16 validation tokens of the default corpus. The default window
(64 tokens) is shorter than the reply, so the cached path also pays for its window jumps.
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

from bench.harness import Result, Stats, default_corpus, fmt_stats, threads
from gpt.config import TrainConfig
from gpt.model import GPT
from gpt.rundir import DataMeta
from gpt.sampling import measure_speed

NEW_TOKENS = 256
PROMPT_TOKENS = 16


def run(quick: bool) -> Result:
    repeats = 2 if quick else 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as root:
        rundir = default_corpus(root)
        meta = DataMeta.read(rundir.meta_json)
        prompt = np.memmap(rundir.val_bin, dtype=meta.dtype, mode="r")[:PROMPT_TOKENS].tolist()
    torch.manual_seed(0)
    config = TrainConfig().model_config(meta.vocab_size)
    model = GPT(config).to(device).eval()
    result = Result(
        "generation",
        {"model": vars(config), "weights": "random", "device": device, "prompt": PROMPT_TOKENS,
         "new_tokens": NEW_TOKENS, "decoding": "greedy", "repeats": repeats, "warmup": 1},
        ["cache", "threads", "tokens/s", "first token", "speed-up"],
    )
    # On a CPU also both paths on one thread: one token at a time is little work to share.
    thread_counts = [None, 1] if device == "cpu" and not quick else [None]
    for n_threads in thread_counts:
        no_cache: Stats | None = None  # the baseline of the speed-up, at the same thread count
        for use_cache in (False, True):
            with threads(n_threads) as used:
                measure_speed(model, prompt, NEW_TOKENS, use_cache)  # warm-up: allocator, kernels
                runs = [measure_speed(model, prompt, NEW_TOKENS, use_cache) for _ in range(repeats)]
            rate = Stats([r.tokens_per_s for r in runs])
            first = Stats([r.first_token_s * 1e3 for r in runs])
            no_cache = no_cache or rate
            result.rows.append(
                {
                    "cache": use_cache,
                    "threads": used if device == "cpu" else "",
                    "tokens/s": fmt_stats(rate),
                    "first token": fmt_stats(first, " ms"),
                    "speed-up": f"{rate.median / no_cache.median:.1f}x",
                    "tokens_per_s": rate.as_dict(),
                    "first_token_ms": first.as_dict(),
                }
            )
    return result
