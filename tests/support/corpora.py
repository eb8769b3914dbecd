"""Corpus files the load-corpus tests write (JSON Lines, Parquet), reading a source as
load-corpus does into one text (tests/workload/data/test_formats.py, test_records.py,
test_objectstore_hf.py), and the token ids of documents, end-of-text between them
(test_tokenfiles.py, test_load_corpus.py)."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpt.data.cleaning import SEPARATOR
from gpt.data.sources import Document, Download, read_source
from gpt.errors import InputError

DL = Download(timeout=2.0, retries=0, backoff=0.0, max_bytes=10_000_000)


def jsonl(docs: list[str | None], field: str = "text") -> bytes:
    """One JSON object a line, `field` holding each document (and an id beside it)."""
    return b"".join(json.dumps({"id": i, field: d}).encode() + b"\n" for i, d in enumerate(docs))


def parquet(docs: list, field: str = "text", row_group_size: int = 2) -> bytes:
    """A Parquet file of an `id` column and `field`, in row groups of `row_group_size`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    table = pa.table({"id": list(range(len(docs))), field: docs})
    pq.write_table(table, out, row_group_size=row_group_size)
    return out.getvalue()


def read(source: Path | str, **kw) -> tuple[str, list[Document]]:
    """The text read_source writes for `source`, and its documents; checks that the offsets it
    gives of the separators between documents are where it wrote them, one between each two."""
    pieces: list[bytes] = []
    breaks: list[int] = []
    with tempfile.TemporaryDirectory() as scratch:
        docs = read_source(str(source), kw.pop("dl", DL), Path(scratch), pieces.append,
                           breaks=breaks.append, **kw)  # fmt: skip
    text = b"".join(pieces)
    assert len(breaks) == sum(d.documents for d in docs) - 1
    assert breaks == sorted(breaks) and all(text[b:b + 2] == SEPARATOR for b in breaks)
    return text.decode(), docs


def joined(docs: list[str], folder: Path) -> tuple[Path, Path]:
    """The text load-corpus cleans `docs` into (SEPARATOR between each two), written to
    `folder`/text.txt, and the file of the separators' byte offsets, as load-corpus keeps it."""
    offsets, at = [], 0
    for doc in docs[:-1]:
        at += len(doc.encode())
        offsets.append(at)
        at += len(SEPARATOR)
    path, breaks = folder / "text.txt", folder / "breaks"
    path.write_bytes(SEPARATOR.join(d.encode() for d in docs))
    np.array(offsets, dtype=np.int64).tofile(breaks)
    return path, breaks


def split_documents(docs: list[str], cut: int) -> tuple[list[str], list[str]]:
    """The documents of each split of `docs` joined as above and cut at character `cut`: the
    parts of documents on either side of it (a separator it falls in or next to is dropped)."""
    splits: tuple[list[str], list[str]] = ([], [])
    pos = 0
    for doc in docs:
        for split, (lo, hi) in enumerate(((0, cut), (cut, pos + len(doc)))):
            a, b = max(pos, lo), min(pos + len(doc), hi)
            if a < b:
                splits[split].append(doc[a - pos : b - pos])
        pos += len(doc) + len(SEPARATOR)
    return splits


def ids_between(documents: list[str], encode: Callable[[str], list[int]], eot: int) -> list[int]:
    """Each document encoded on its own, end-of-text between each two (nanoGPT's prepare.py
    puts it after each)."""
    ids: list[int] = []
    for k, doc in enumerate(documents):
        ids += ([eot] if k else []) + encode(doc)
    return ids


def refusal(source: Path | str, **kw) -> str:
    """The one-line InputError reading `source` ends with."""
    with pytest.raises(InputError) as e:
        read(source, **kw)
    message = str(e.value)
    assert "\n" not in message, "one line"
    return message
