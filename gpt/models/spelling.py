"""How each token of a vocabulary is spelt, in byte n-grams: what the model's spelled embedding
shares between tokens (gpt/models/model.py).

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

On a small text, a token the training split holds fewer than three times has no free vector:
its row is its spelling alone, as fastText builds the vector of a word it never saw from its
n-grams. A free row of a token training never shows would only ever be pushed down (it is never
a target), and Adam pushes a row with a small but steady gradient at full speed: the default
corpus's validation tokens that training never sees cost 11.6 nats each that way and 9.4
spelled alone; and a token seen once or twice is predicted better by its spelling alone than
with a row fitted to those few occurrences (bench/recipe_trials.md). The vocabulary holds
tokens training never shows because load-corpus fits it on the whole text, and because BPE
keeps the merges on the way to longer tokens. On a large text the tokens training lacks are
nearly all such intermediate merges, which no text holds, and there the pushed-down rows are right
(`free_vectors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gpt.tokenizer.kinds import Tokenizer

START = -1  # marks the token's start inside an n-gram; never a byte
# Rare tokens are spelled alone where more than this share of the training split's tokens occur
# in it once: Good-Turing's estimate of how often new text holds a token the split never does.
# The default corpus: 6.2%; the plays and the German fortunes: 0.01-0.02%, where spelling the
# tokens they lack alone cost 0.004 bits per byte (they are mostly BPE's intermediate merges).
NOVEL_SHARE = 0.01
# There, a token needs this many occurrences in the training split for a free vector: the
# default corpus ends 1.774 with 3, 1.779 with 4, 1.780 with 2, 1.808 with 1 (seed 1337), 1.863
# with none (the trials of bench/recipe_trials.md, run before the CPU dropout mask).
FREE_MIN_COUNT = 3


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
    free: torch.Tensor  # (vocab_size,) bool
    """Which tokens have a free vector besides their spelling (`free_vectors`)."""

    @property
    def vocab_size(self) -> int:
        return len(self.offsets)


def free_vectors(train_counts: np.ndarray) -> np.ndarray:
    """Which tokens get a free vector, from how often the training split holds each: all of
    them, but on a small text (NOVEL_SHARE) only those it holds FREE_MIN_COUNT times or more."""
    novel = (train_counts == 1).sum() / max(1, train_counts.sum())
    if novel > NOVEL_SHARE:
        return train_counts >= FREE_MIN_COUNT
    return np.ones(len(train_counts), dtype=bool)


def spelling_of(tokenizer: Tokenizer, n: int, free: Sequence[bool] | None = None
                ) -> Spelling | None:
    """The spelling of `tokenizer`'s vocabulary in n-grams up to `n` long (a model's
    `config.spelling`); None for 0, a plain table. `free`: as `spell` takes it."""
    if not n:
        return None
    return spell([tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)], n, free)


def spell(tokens: Sequence[bytes], n: int, free: Sequence[bool] | None = None) -> Spelling:
    """The byte n-grams (1 to `n` long) of every token of a vocabulary, `tokens` by id; `free`
    (by id; default: all) says which tokens have free vectors (training: `free_vectors`).

    Without `free` (a model rebuilt from a checkpoint, for evaluation or export) every token keeps
    its free row: a trained row without one is zero, so the model is the same."""
    if n < 1:
        raise ValueError(f"n {n!r}: must be at least 1")
    if free is not None and len(free) != len(tokens):
        raise ValueError(f"free: {len(free)} flags for a vocabulary of {len(tokens)}")
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
        free=torch.ones(len(tokens), dtype=torch.bool) if free is None
        else torch.as_tensor(free, dtype=torch.bool),
    )
