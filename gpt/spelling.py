"""How each token of a vocabulary is spelt, in byte n-grams: what the model's spelled embedding
shares between tokens (gpt/model.py).

A BPE vocabulary fitted to a small text holds thousands of tokens that its training split shows a
few times or never: on the default corpus 4.7% of the validation tokens never occur in training
and cost 12 nats each, and tokens seen fewer than ten times carry 43% of the loss
(bench/recipe_trials.md). A table of independent rows learns nothing about such a token. Spelt
out, " remember" shares " r", "re", "em", ... with every token that holds them, so what the
model learns of those pieces reaches it: the row of each token is a free vector plus the mean of
vectors shared by its byte n-grams, as fastText builds word vectors from character n-grams
(Bojanowski et al. 2017).

The n-grams are a token's single bytes and, up to length `n`, its byte runs, the first of them
marked as the token's start (" r" at the start of " remember" is not the "r" inside "three").
They are numbered in order of first appearance, token by token in id order, so the same
vocabulary gives the same numbering every time: a resumed run rebuilds exactly the table it
saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpt.tokenizer import Tokenizer

START = -1  # marks the token's start inside an n-gram; never a byte


@dataclass(frozen=True)
class Spelling:
    """Each token's byte n-grams as `torch.nn.functional.embedding_bag` takes them: token i's
    n-gram ids are `index[offsets[i]:offsets[i + 1]]`, each weighted `weights` = 1/count, so the
    bag is their mean."""

    n: int
    """The longest n-gram."""
    grams: int
    """How many distinct n-grams the vocabulary holds: rows of the model's n-gram table."""
    index: torch.Tensor  # (total n-grams,) int64
    offsets: torch.Tensor  # (vocab_size,) int64
    weights: torch.Tensor  # (total n-grams,) float32

    @property
    def vocab_size(self) -> int:
        return len(self.offsets)


def spelling_of(tokenizer: Tokenizer, n: int) -> Spelling | None:
    """The spelling of `tokenizer`'s vocabulary in n-grams up to `n` long (a model's
    `config.spelling`); None for 0, a plain table."""
    if not n:
        return None
    return spell([tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)], n)


def spell(tokens: Sequence[bytes], n: int) -> Spelling:
    """The byte n-grams (1 to `n` long) of every token of a vocabulary, `tokens` by id."""
    if n < 1:
        raise ValueError(f"n {n!r}: must be at least 1")
    ids: dict[tuple[int, ...], int] = {}
    index: list[int] = []
    offsets: list[int] = []
    weights: list[float] = []
    for token in tokens:
        marked = (START, *token)
        grams = [(b,) for b in token]
        for k in range(2, n + 1):
            grams += [marked[j : j + k] for j in range(len(marked) - k + 1)]
        offsets.append(len(index))
        index += [ids.setdefault(g, len(ids)) for g in grams]
        weights += [1.0 / len(grams)] * len(grams)
    return Spelling(
        n=n,
        grams=len(ids),
        index=torch.tensor(index, dtype=torch.int64),
        offsets=torch.tensor(offsets, dtype=torch.int64),
        weights=torch.tensor(weights, dtype=torch.float32),
    )
