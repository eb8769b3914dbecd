"""The sampling engine: token ids in, token ids out, one at a time.

It knows nothing of text (the tokenizer and the REPL sit apart, as in nanochat). `generate` crops
the prompt to the context window, prefills the model's KV cache once, then feeds the new tokens
one at a time. Cached keys are rotated for their positions in the window (0 .. block_size-1,
the positions the model trained on), so a cache cannot simply drop its oldest entries when the
window is full: the window jumps forward, keeping the newest three quarters of it, and the cache
is rebuilt by prefilling those at positions from 0 again. Without a cache the model sees exactly
the same windows, so both paths give the same tokens; the cache only makes it faster.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch

from gpt.config.configs import SamplingConfig
from gpt.models.model import GPT


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the smallest set of most likely tokens whose probability
    adds up to at least `top_p` (the nucleus). `logits` is (V,); the most likely token always stays.
    """
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # a token is outside the nucleus when the tokens before it already reach top_p
    mass_before = torch.cumsum(probs, dim=-1) - probs
    outside = mass_before >= top_p
    return logits.masked_fill(outside.scatter(0, order, outside), float("-inf"))


def sample_next(
    logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None
) -> int:
    """Pick one token id from the last position's (V,) logits."""
    if cfg.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / cfg.temperature
    if 0 < cfg.top_k < logits.size(-1):  # 0: no limit
        kth = torch.topk(logits, cfg.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1:
        logits = top_p_filter(logits, cfg.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private random stream for sampling: a seed makes replies reproducible; None picks one."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def window_keep(block_size: int) -> int:
    """Tokens kept when the window is full: the newest three quarters (at least one is dropped).

    Dropping a quarter at a time means the cache is rebuilt once every block_size/4 tokens, not
    once per token, at the price of the model seeing between 3/4 and all of the window.
    """
    return block_size - max(1, block_size // 4)


@torch.inference_mode()
def generate(
    model: GPT,
    prompt: list[int],
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    stop_ids: Collection[int] = (),
    vocab_size: int | None = None,
    use_cache: bool = True,
) -> Iterator[int]:
    """Yield up to `cfg.max_new_tokens` new token ids continuing `prompt`, as each is sampled.

    Stops early at any of `stop_ids` (which is not yielded): end-of-text, a chat model's end of
    turn. Only ids below `vocab_size` are sampled: the
    tokenizer's vocabulary, which may be smaller than the model's (a model built with spare
    ids). The prompt is cropped to its last block_size tokens. `use_cache=False` recomputes the
    whole window for every token: the reference the cached path must match, and the baseline for
    benchmarks.
    """
    if not prompt:
        raise ValueError("generate needs at least one prompt token")
    block_size = model.config.block_size
    device = model.lm_head.weight.device
    tokens = list(prompt[-block_size:])
    start = 0  # the window is tokens[start:]
    cache = model.new_cache(batch_size=1) if use_cache else None
    feed = tokens  # what the model has not seen yet
    for _ in range(cfg.max_new_tokens):
        if len(tokens) - start > block_size:
            start = len(tokens) - window_keep(block_size)
            if cache is not None:
                cache.reset()
                feed = tokens[start:]
        if cache is None:
            feed = tokens[start:]
        idx = torch.tensor([feed], dtype=torch.long, device=device)
        logits, _ = model(idx, cache=cache)
        nxt = sample_next(logits[0, -1, :vocab_size], cfg, generator)
        if nxt in stop_ids:
            return
        yield nxt
        tokens.append(nxt)
        feed = [nxt]


@dataclass
class Speed:
    """What `measure_speed` found for one way of generating."""

    first_token_s: float
    """Seconds from the call to the first new token (prefill + one sample)."""
    tokens_per_s: float
    """New tokens per second over the whole generation, first token included."""


def measure_speed(model: GPT, prompt: list[int], max_new_tokens: int, use_cache: bool) -> Speed:
    """Time one greedy generation of exactly `max_new_tokens` (no end-of-text stop)."""
    cfg = SamplingConfig(temperature=0, max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    first = None
    n = 0
    for _ in generate(model, prompt, cfg, use_cache=use_cache):
        n += 1
        if first is None:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return Speed(first_token_s=first if first is not None else total, tokens_per_s=n / total)
