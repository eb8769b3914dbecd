"""load-corpus's chat path (--chat true): conversations from records to token files and the
loss's mask, in bounded memory.

    records' `messages` (gpt/data/sources.py reads them as it reads text records) -> checked
    and rendered with the chat template (gpt/tokenizer/chat.py), each cut after its last
    assistant turn that fits in --block_size + 1 tokens -> scratch files of ids, counted flags
    and lengths (and the rendered text, corpus/text.txt) -> the vocabulary fitted to them
    (--compact) -> the last --val_fraction of the conversations is validation -> each split
    packed into rows of --block_size + 1 tokens: whole conversations, in order, as many as fit,
    then end-of-text padding that the loss never counts -> data/{train,val}.bin and
    data/{train,val}.mask (a byte per token: 1 where the loss counts it as a target).

Why rows of whole conversations: a training window is one row (gpt/training/batches.py), so it
starts where a conversation starts, as a reply starts from apply_chat_template's prefix at
serving time, and it never cuts a turn; packing several short conversations into a row wastes
less than one conversation a row (nanochat's SFT pads each alone), at the cost that a later
conversation of a row sees the earlier ones as context, as pretraining's packed documents do.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from gpt.data.records import Records
from gpt.data.tokenfiles import TokenFiles
from gpt.errors import InputError
from gpt.rundir.layout import dtype_for
from gpt.tokenizer.chat import (
    IM_END,
    IM_START,
    MARKERS,
    Malformed,
    Renderer,
    check,
    header,
    token_lengths,
)
from gpt.tokenizer.kinds import GPT2Tokenizer

CONVERSATIONS_AT_ONCE = 4096  # conversations read back at a time while packing
COUNT_EVERY = 1 << 20  # ids held before they are counted (a bincount a conversation is slow)
SPLITS = ("train", "val")


class Conversations:
    """The conversations of one source, as they are read: rendered with `tok` (a chat
    tokenizer) into scratch files, each cut to `limit` ids at a turn boundary, and counted."""

    def __init__(self, tok: GPT2Tokenizer, scratch: Path, limit: int) -> None:
        self.tok, self.limit = tok, limit
        self.renderer = Renderer(tok.bpe)
        self.paths = {k: scratch / f"chat.{k}" for k in ("ids", "counted", "lengths")}
        for path in self.paths.values():
            path.write_bytes(b"")
        self._counts = np.zeros(tok.vocab_size, dtype=np.int64)
        self._uncounted: list[np.ndarray] = []
        self._held = 0
        self.count = self.cut = 0

    def counts(self) -> np.ndarray:
        """How often each id occurs in the conversations taken so far."""
        self._count_held()
        return self._counts

    def _count_held(self) -> None:
        if self._uncounted:
            ids = np.concatenate(self._uncounted)
            self._counts += np.bincount(ids, minlength=len(self._counts))
            self._uncounted, self._held = [], 0

    def take(self, origin: str, records: Iterable[tuple[str, object]],
             write: Callable[[bytes], object], max_bytes: int) -> Records:
        """Render the `messages` of each record (where it is: "line 3", "row 3") of the file
        `origin`, writing its rendered text through `write`; a null one is skipped, one whose
        first assistant turn does not fit is skipped as "too long", a malformed one refused."""
        out = Records()
        with (open(self.paths["ids"], "ab") as ids, open(self.paths["counted"], "ab") as counted,
              open(self.paths["lengths"], "ab") as lengths):  # fmt: skip
            for where, messages in records:
                if messages is None:
                    out.skip("null")
                    continue
                try:
                    turns = check(messages)
                except Malformed as e:
                    raise InputError(f"--source {origin!r}: {where}: {e}") from None
                rendered = self.renderer.render(turns, self.limit)
                if rendered is None:
                    out.skip("too long")
                    continue
                ids.write(rendered.ids.astype(np.uint32).tobytes())
                counted.write(rendered.counted.tobytes())
                lengths.write(np.int64(len(rendered.ids)).tobytes())
                self._uncounted.append(rendered.ids)
                self._held += len(rendered.ids)
                if self._held >= COUNT_EVERY:
                    self._count_held()
                self.cut += rendered.cut
                self.count += 1
                kept = turns[: _turns_in(rendered.ids, self.renderer.start)]
                text = "".join(f"{IM_START}{header(r)}{c}{IM_END}\n" for r, c in kept)
                data = (("\n" if self.count > 1 else "") + text).encode("utf-8")
                write(data)
                out.documents += 1
                out.kept_bytes += len(data)
                if out.kept_bytes > max_bytes:
                    raise InputError(f"--source {origin!r}: more than --max_bytes {max_bytes} "
                                     "bytes of conversations")
        return out

    def report(self) -> dict[str, int]:
        """What source.json and the log say of the conversations."""
        return {"conversations": self.count, "cut": self.cut, "block_size": self.limit - 1}

    def token_files(self, compact: bool, val_fraction: float, out: Path) -> tuple[
            TokenFiles, tuple[int, int]]:  # fmt: skip
        """Fit the vocabulary (with `compact`, to the tokens the conversations use, when the
        tokenizer is GPT-2's whole one), split, and pack each split into `out`/{split}.bin and
        .mask: the token files, and the tokens the loss counts per split."""
        tok, lookup = self.tok, None
        if compact and tok.kept is None:
            # Every token the conversations use, and never --max_vocab's byte fallback, which
            # would split a counted token into several.
            tok = GPT2Tokenizer.fit_counts(self.counts()[: tok.base_size()], 0, chat=True)
            lookup = np.full(self.tok.vocab_size, -1, dtype=np.int64)
            lookup[tok.kept] = np.arange(len(tok.kept))
            lookup[-len(MARKERS):] = np.arange(tok.base_size(), tok.vocab_size)
        n_train = int(self.count * (1 - val_fraction))
        if not 0 < n_train < self.count:
            raise InputError(f"--val_fraction {val_fraction}: {self.count:,} conversation(s) "
                             "leave none for one of the splits; more conversations are needed")
        lengths = token_lengths(tok.bpe)
        tokens, nbytes, counted = [0, 0], [0, 0], [0, 0]
        with contextlib.closing(self._read(lookup)) as conversations:
            for split, n in enumerate((n_train, self.count - n_train)):
                with (open(out / f"{SPLITS[split]}.bin", "wb") as ids_f,
                      open(out / f"{SPLITS[split]}.mask", "wb") as mask_f):  # fmt: skip
                    for ids, mask in pack(itertools.islice(conversations, n), self.limit,
                                          tok.eot_id):
                        ids_f.write(ids.astype(dtype_for(tok.vocab_size)).tobytes())
                        mask_f.write(mask.tobytes())
                        tokens[split] += len(ids)
                        counted[split] += int(mask.sum())
                        nbytes[split] += int(lengths[ids[mask.astype(bool)]].sum())
        return TokenFiles(tok, (tokens[0], tokens[1]), (nbytes[0], nbytes[1])), (
            counted[0], counted[1])

    def _read(self, lookup: np.ndarray | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The conversations back from the scratch files, in order, renumbered by `lookup`."""
        with (open(self.paths["ids"], "rb") as ids, open(self.paths["counted"], "rb") as counted,
              open(self.paths["lengths"], "rb") as lengths):  # fmt: skip
            while len(sizes := np.fromfile(lengths, dtype=np.int64, count=CONVERSATIONS_AT_ONCE)):
                total = int(sizes.sum())
                block = np.fromfile(ids, dtype=np.uint32, count=total).astype(np.int64)
                flags = np.fromfile(counted, dtype=np.uint8, count=total)
                if lookup is not None:
                    block = lookup[block]
                cuts = np.cumsum(sizes)[:-1]
                yield from zip(np.split(block, cuts), np.split(flags, cuts), strict=True)


def pack(conversations: Iterable[tuple[np.ndarray, np.ndarray]], row: int, pad: int
         ) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Rows of `row` ids and their counted flags: whole conversations (none longer than `row`)
    in order, as many as fit, then `pad` ids never counted."""
    ids: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    held = 0
    for conv_ids, conv_flags in conversations:
        if held + len(conv_ids) > row:
            yield _padded(ids, flags, row, pad)
            ids, flags, held = [], [], 0
        ids.append(conv_ids)
        flags.append(conv_flags)
        held += len(conv_ids)
    if ids:
        yield _padded(ids, flags, row, pad)


def _padded(ids: list[np.ndarray], flags: list[np.ndarray], row: int, pad: int
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    held = sum(len(a) for a in ids)
    return (np.concatenate([*ids, np.full(row - held, pad, dtype=np.int64)]),
            np.concatenate([*flags, np.zeros(row - held, dtype=np.uint8)]))


def _turns_in(ids: np.ndarray, start: int) -> int:
    """How many turns a rendering holds: one `<|im_start|>` each."""
    return int((ids == start).sum())


def chat_tokenizer(tok: object, where: str) -> GPT2Tokenizer:
    """The chat form of a GPT-2 BPE tokenizer: the same vocabulary, the markers after it (a
    tokenizer that has them already is taken as it is); a character tokenizer is refused."""
    if not isinstance(tok, GPT2Tokenizer):
        raise InputError(f"{where}: the chat format needs GPT-2's BPE (its markers are special "
                         "tokens), not a character tokenizer")
    return tok if tok.chat else GPT2Tokenizer(tok.kept, chat=True)
