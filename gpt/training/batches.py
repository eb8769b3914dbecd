"""Training data: the token ids load-corpus wrote to `data/`, and the batches drawn from them.

Training batches are random windows of `block_size + 1` tokens (inputs and shifted targets), as in
nanoGPT; of chat data (gpt/data/conversations.py), random rows, each of whole conversations, and
the targets the mask does not count are IGNORE, which the loss leaves out. The windows of
iteration `s` are drawn from a generator seeded with `(seed, s)`, so the iteration's number alone
is the data position: a resumed run draws exactly the batches the interrupted one would have,
and any number of ranks and micro-batches split one and the same set of windows between them
(see `Batches.get`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gpt.errors import InputError
from gpt.rundir.layout import DataMeta, RunDir
from gpt.tokenizer.kinds import Tokenizer, load_tokenizer

IGNORE = -100  # a target the loss leaves out (F.cross_entropy's and gpt/models/loss.py's default)


@dataclass(frozen=True)
class TokenData:
    meta: DataMeta
    train: np.ndarray  # read-only memmaps: a corpus larger than memory still trains
    val: np.ndarray
    tokenizer: Tokenizer
    train_counts: np.ndarray  # (vocab_size,) int64: how often the training split holds each id
    train_mask: np.ndarray | None = None  # chat data: 1 where the loss counts the token
    val_mask: np.ndarray | None = None

    @classmethod
    def load(cls, rundir: RunDir) -> TokenData:
        hint = f"run `python -m gpt load-corpus --root {rundir.root} --run {rundir.run_id}` first"
        if not rundir.data_dir.is_dir():
            raise InputError(f"{rundir.data_dir}: no training data; {hint}")
        for path in (rundir.meta_json, rundir.train_bin, rundir.val_bin, rundir.tokenizer_json):
            if not path.is_file():
                raise InputError(f"{path}: missing; {hint}")
        meta = DataMeta.read(rundir.meta_json)
        tokenizer = load_tokenizer(rundir.tokenizer_json)  # a bad one fails now, not at the export
        itemsize = np.dtype(meta.dtype).itemsize
        arrays = []
        splits = ((rundir.train_bin, meta.train_tokens), (rundir.val_bin, meta.val_tokens))
        for path, tokens in splits:
            size = path.stat().st_size
            if size != tokens * itemsize:
                raise InputError(
                    f"{path}: {size} bytes, but meta.json says {tokens} {meta.dtype} tokens "
                    f"({tokens * itemsize} bytes); the data directory is inconsistent, {hint}"
                )
            arrays.append(np.memmap(path, dtype=meta.dtype, mode="r"))
        train, val = arrays
        masks = [None, None]
        if meta.chat:
            for i, (path, tokens) in enumerate(((rundir.train_mask, meta.train_tokens),
                                                (rundir.val_mask, meta.val_tokens))):
                if not path.is_file() or path.stat().st_size != tokens:
                    raise InputError(f"{path}: missing or not one byte per token of chat data "
                                     f"({tokens}); {hint}")
                masks[i] = np.memmap(path, dtype=np.uint8, mode="r")
        # One pass over each split (about a second per GB): an id past the vocabulary would
        # otherwise fail deep inside the embedding, or silently on a GPU.
        train_counts = count_ids(train, meta.vocab_size)
        highest_ids = ((rundir.train_bin, len(train_counts) - 1), (rundir.val_bin, val.max()))
        for path, highest in highest_ids:
            if highest >= meta.vocab_size:
                raise InputError(
                    f"{path}: holds token id {highest}, but meta.json says vocab_size "
                    f"{meta.vocab_size}; the data directory is inconsistent, {hint}"
                )
        return cls(meta, train, val, tokenizer, train_counts, *masks)

    @property
    def row(self) -> int | None:
        """Chat data's row: the tokens of a window (None: text, any offset starts one)."""
        return self.meta.block_size + 1 if self.meta.chat else None

    def check_block_size(self, block_size: int) -> None:
        """Every window needs block_size + 1 tokens (inputs plus the next-token targets); a
        window of chat data is one of its rows."""
        if self.meta.chat and block_size != self.meta.block_size:
            raise InputError(
                f"--block_size {block_size}: the chat data holds rows of whole conversations "
                f"for --block_size {self.meta.block_size} (load-corpus's); train with that, or "
                "run load-corpus again with this one")
        for split, tokens in (("train", self.meta.train_tokens), ("val", self.meta.val_tokens)):
            if tokens < block_size + 1:
                raise InputError(
                    f"--block_size {block_size}: {split}.bin holds only {tokens} tokens, and a "
                    f"window needs block_size + 1; lower --block_size (at most {tokens - 1}) "
                    "or use a larger corpus"
                )


def count_ids(tokens: np.ndarray, vocab_size: int, slice_len: int = 1 << 24) -> np.ndarray:
    """How often each id occurs in `tokens`: (vocab_size,) int64, longer if an id is past the
    vocabulary. `slice_len` ids at a time, so a memmapped corpus larger than memory is never
    copied whole (bincount copies to int64)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), slice_len):
        part = np.bincount(tokens[start : start + slice_len], minlength=vocab_size)
        if len(part) > len(counts):
            counts = np.pad(counts, (0, len(part) - len(counts)))
        counts += part
    return counts


def _windows(tokens: np.ndarray, offsets: np.ndarray, block_size: int, device: torch.device,
             mask: np.ndarray | None = None):
    rows = np.stack([tokens[o : o + block_size + 1] for o in offsets]).astype(np.int64)
    xy = torch.from_numpy(rows)
    if device.type == "cuda":
        xy = xy.pin_memory().to(device, non_blocking=True)
    x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
    if mask is not None:  # a target the mask does not count is left out of the loss
        counted = np.stack([mask[o + 1 : o + block_size + 1] for o in offsets]).astype(bool)
        y = y.masked_fill(~torch.from_numpy(counted).to(device), IGNORE)
    return x, y


@dataclass(frozen=True)
class Batches:
    """The training batches: `batch_size` windows per iteration."""

    tokens: np.ndarray
    block_size: int
    batch_size: int
    seed: int
    mask: np.ndarray | None = None
    """Chat data's mask: windows are its rows, and the targets it does not count are IGNORE."""

    def offsets(self, iteration: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, iteration])
        if self.mask is not None:
            row = self.block_size + 1
            return rng.integers(0, len(self.tokens) // row, size=self.batch_size) * row
        return rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)

    def get(self, iteration: int, part: int, parts: int, device: torch.device):
        """Inputs and targets, (B / parts, block_size) each, of `part` of `parts` equal shares.

        Rank r doing micro-batch m of A on W ranks takes part r * A + m of W * A, so however the
        iteration is split, its gradient is the mean over the same `batch_size` windows.
        """
        share = np.array_split(self.offsets(iteration), parts)[part]
        return _windows(self.tokens, share, self.block_size, device, self.mask)


def eval_offsets(n_tokens: int, block_size: int, max_windows: int,
                 row: int | None = None) -> np.ndarray:
    """Fixed, evenly spread, non-overlapping windows over the validation split (chat data: rows
    of `row` tokens).

    The same windows every evaluation, so successive val losses differ only by the model; a
    small split is covered completely.
    """
    if row is not None:
        rows = n_tokens // row
        return np.linspace(0, rows - 1, min(max_windows, rows)).astype(np.int64) * row
    count = min(max_windows, (n_tokens - 1) // block_size)
    if count == 1:
        return np.zeros(1, dtype=np.int64)
    stride = (n_tokens - 1 - block_size) / (count - 1)  # >= block_size: windows never overlap
    return (np.arange(count) * stride).astype(np.int64)


def eval_batches(tokens: np.ndarray, offsets: np.ndarray, block_size: int, batch_size: int,
                 device: torch.device, mask: np.ndarray | None = None):
    for start in range(0, len(offsets), batch_size):
        yield _windows(tokens, offsets[start : start + batch_size], block_size, device, mask)
