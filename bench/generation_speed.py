"""Generation: tokens/s and first-token latency for 256 new tokens, with and without the KV cache,
and through transformers' `generate` on the same model's export (the Hugging Face directory
train-gpt writes, loaded with AutoModelForCausalLM).

The model has the default shape of `python -m gpt train-gpt` and the vocabulary of the default
corpus, with random weights: speed does not depend on what the model learned. Greedy decoding
of exactly 256 tokens (`gpt.generation.sampling.measure_speed`), so both paths do the same work
token for token. The prompt is the first 16 validation tokens of the default corpus. The default
window (64 tokens) is shorter than the reply, so the cached path also pays for its window jumps;
transformers' keeps every token in its cache instead (rotary positions go on past the window).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.harness import Result, Stats, default_corpus, fmt_stats, threads
from gpt.config.configs import TrainConfig
from gpt.generation.sampling import Speed, measure_speed
from gpt.models.export import save_export
from gpt.models.model import GPT
from gpt.rundir.layout import DataMeta
from gpt.tokenizer.kinds import load_tokenizer
from gpt.training.recipe import finish

NEW_TOKENS = 256
PROMPT_TOKENS = 16


def run(quick: bool) -> Result:
    repeats = 2 if quick else 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as root:
        rundir = default_corpus(root)
        meta = DataMeta.read(rundir.meta_json)
        prompt = np.memmap(rundir.val_bin, dtype=meta.dtype, mode="r")[:PROMPT_TOKENS].tolist()
        tokenizer = load_tokenizer(rundir.tokenizer_json)
        torch.manual_seed(0)
        config = finish(TrainConfig(), meta.vocab_size, meta.train_tokens).model
        model = GPT(config).to(device).eval()
        save_export(model, tokenizer, Path(root) / "model")
        theirs = hf_model(Path(root) / "model", device)
    result = Result(
        "generation",
        {"model": vars(config), "weights": "random", "device": device, "prompt": PROMPT_TOKENS,
         "new_tokens": NEW_TOKENS, "decoding": "greedy", "repeats": repeats, "warmup": 1},
        ["engine", "cache", "threads", "tokens/s", "first token", "speed-up"],
    )

    def one_run(engine: str, use_cache: bool) -> Speed:
        if engine == "transformers":
            return hf_speed(theirs, prompt, NEW_TOKENS)
        return measure_speed(model, prompt, NEW_TOKENS, use_cache)

    # On a CPU also both paths on one thread: one token at a time is little work to share.
    thread_counts = [None, 1] if device == "cpu" and not quick else [None]
    for n_threads in thread_counts:
        no_cache: Stats | None = None  # the baseline of the speed-up, at the same thread count
        for engine, use_cache in (("ours", False), ("ours", True), ("transformers", True)):
            with threads(n_threads) as used:
                one_run(engine, use_cache)  # warm-up: allocator, kernels
                runs = [one_run(engine, use_cache) for _ in range(repeats)]
            rate = Stats([r.tokens_per_s for r in runs])
            first = Stats([r.first_token_s * 1e3 for r in runs])
            no_cache = no_cache or rate
            result.rows.append(
                {
                    "engine": engine,
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


def hf_model(path: Path, device: str):
    """The export as transformers loads it, for greedy decoding of exactly the tokens asked."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    model.generation_config.eos_token_id = None  # never stop early: every row makes 256 tokens
    return model


@torch.inference_mode()
def hf_speed(model, prompt: list[int], max_new_tokens: int) -> Speed:
    """`generate` (greedy, its KV cache): the first token timed by a one-token call, the rate
    over a whole call, as `measure_speed` counts them."""
    idx = torch.tensor([prompt], device=model.device)
    t0 = time.perf_counter()
    model.generate(idx, max_new_tokens=1, do_sample=False)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(idx, max_new_tokens=max_new_tokens, do_sample=False)
    total = time.perf_counter() - t0
    return Speed(first_token_s=first, tokens_per_s=(out.size(1) - len(prompt)) / total)
