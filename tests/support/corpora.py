"""Corpus files the load-corpus tests write (JSON Lines, Parquet), and reading a source as
load-corpus does into one text (tests/workload/data/test_formats.py, test_records.py,
test_objectstore_hf.py)."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import pytest

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
    """The text read_source writes for `source`, and its documents."""
    pieces: list[bytes] = []
    with tempfile.TemporaryDirectory() as scratch:
        docs = read_source(str(source), kw.pop("dl", DL), Path(scratch), pieces.append, **kw)
    return b"".join(pieces).decode(), docs


def refusal(source: Path | str, **kw) -> str:
    """The one-line InputError reading `source` ends with."""
    with pytest.raises(InputError) as e:
        read(source, **kw)
    message = str(e.value)
    assert "\n" not in message, "one line"
    return message
