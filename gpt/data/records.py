"""Documents from records: JSON Lines and Parquet files, streamed, each record's text field one
document (or, for chat data, its `messages`: gpt/data/conversations.py).

A JSON Lines file is read in chunks and cut into lines (a line may be at most MAX_LINE bytes);
each non-blank line must be a JSON object (orjson parses it, the standard json where orjson
refuses it). A Parquet file is read a row group at a time, only the text column (pyarrow). A
record whose field is null, empty or only whitespace is skipped and counted; a missing field, a
field that is not a string, a line that is not JSON, a Parquet file without the column are
refused, one line naming the file, the line and the reason.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.data.ahead import ahead
from gpt.data.cleaning import SEPARATOR, clean
from gpt.errors import InputError, first_line

MAX_LINE = 64 << 20  # a JSON Lines record longer than this is refused, not held
ROWS = 4096  # Parquet rows converted to Python strings at a time (within a row group)
WRITE_BYTES = 1 << 20  # documents' text handed on at a time


@dataclass
class Missing:
    """Records without the field: how many, and the first one's line."""

    count: int = 0
    first: int = 0


@dataclass
class Records:
    """What a file of records gave: documents written, their bytes, records skipped (null,
    empty), and what cleaning removed from the documents (summed)."""

    documents: int = 0
    kept_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


# The JSON parser; None: orjson's, 2.2x the standard json's speed on these records (bench/
# corpus_formats.py sets this to measure the standard json again). Imported when a file is read,
# as pyarrow and zstandard are: the component image loads this module (the configs' defaults)
# and has none of them. Where orjson refuses a line, the standard json parses it (`_record`).
loads: Callable[[bytes], object] | None = None
_NO_TEXT = object()  # a blank line, or a record without the field
_SURROGATE = re.compile("[\ud800-\udfff]")


def jsonl_texts(origin: str, chunks: Iterable[bytes], text_field: str) -> Iterator[str | None]:
    """The field `text_field` of every record of a JSON Lines stream (None where it is null);
    refuses a line that is no JSON object, a field that is not a string, and (once the whole
    file is read, to say how many) records without the field."""
    for _, text in jsonl_values(origin, chunks, text_field):
        yield text  # type: ignore[misc]


def jsonl_values(origin: str, chunks: Iterable[bytes], name: str, string: bool = True,
                 hint: str = "choose it with --text_field") -> Iterator[tuple[int, object]]:
    """(line, value) of the field `name` of every record of a JSON Lines stream: a string or
    null where `string`, else any JSON value; refuses what `jsonl_texts` refuses, `hint`
    saying what to do about records without the field."""
    if loads is None:
        import orjson

        parse = orjson.loads
    else:
        parse = loads
    missing = Missing()
    for line_no, line in enumerate(_lines(origin, chunks), 1):
        value = _field_of(origin, line, line_no, name, missing, parse, string)
        if value is not _NO_TEXT:
            yield line_no, value
    if missing.count:
        raise InputError(
            f"--source {origin!r}: {missing.count:,} record(s) without the field "
            f"{name!r} (the first on line {missing.first}); {hint}"
        )


def _lines(origin: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a stream given in chunks (without their newlines), none above MAX_LINE."""
    count, carry = 0, b""
    for chunk in chunks:
        lines = (carry + chunk if carry else chunk).split(b"\n")
        carry = lines.pop()
        count += len(lines)
        if len(carry) > MAX_LINE:
            raise InputError(f"--source {origin!r}: line {count + 1} is longer than "
                             f"{MAX_LINE:,} bytes: not JSON Lines?")
        yield from lines
    if carry:
        yield carry


def _field_of(origin: str, line: bytes, line_no: int, text_field: str, missing: Missing,
              parse: Callable[[bytes], object], string: bool = True) -> object:
    """The field of the record on `line` (None where null; a string unless not `string`), or
    _NO_TEXT."""
    if not line or line.isspace():
        return _NO_TEXT
    try:
        record = _record(line, parse)
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes not UTF-8
        if line_no == 1 and line.lstrip().startswith(b"["):
            raise InputError(f"--source {origin!r}: a JSON array, not JSON Lines (one object "
                             "a line)") from None
        raise InputError(
            f"--source {origin!r}: invalid JSON on line {line_no}: {first_line(e)}"
        ) from None
    if not isinstance(record, dict):
        raise InputError(f"--source {origin!r}: line {line_no} is a JSON "
                         f"{_json_type(record)}, not an object (JSON Lines: one object a line)")
    if text_field not in record:
        missing.count += 1
        missing.first = missing.first or line_no
        return _NO_TEXT
    value = record[text_field]
    if string and value is not None and not isinstance(value, str):
        raise InputError(f"--source {origin!r}: line {line_no}: field {text_field!r} is a JSON "
                         f"{_json_type(value)}, not a string")
    return value


# orjson's refusal of a value nested deeper than 1024 levels.
_TOO_DEEP = "depth limit exceeded"


def _record(line: bytes, parse: Callable[[bytes], object]) -> object:
    """The JSON value on `line`. Where orjson refuses it, the standard json takes what it reads
    all the same: integers past 64 bits, and NaN as Python writes it, in fields other than the
    text whatever they hold; the rest is refused with its words, or orjson's where it is no
    error of syntax (nesting deeper than 1024, a lone surrogate \\ud800: no UTF-8 text
    holds one)."""
    try:
        return parse(line)
    except ValueError as fast:
        if str(fast).startswith(_TOO_DEEP):
            # The standard json's own limit is the interpreter's recursion limit, which
            # torch.compile raises to 2000: the same line would pass or not by what ran before.
            raise fast from None
        try:
            record = json.loads(line)  # raises where the line is not JSON
        except RecursionError:
            raise fast from None
        if b"\\u" in line and _has_surrogate(record):
            raise fast from None
        return record


def _has_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(
        type(value), type(value).__name__)


def parquet_texts(origin: str, path: Path, text_field: str) -> Iterator[str | None]:
    """The column `text_field` of a Parquet file, row group by row group (None where null);
    refuses a file without that column (naming the columns it has) or with a column that is
    not a string."""
    import pyarrow as pa

    def is_string(kind: pa.DataType) -> bool:
        return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or getattr(pa.types, "is_string_view", lambda t: False)(kind))

    # NumPy's object array of str: 1.5x to_pylist's speed (no Arrow scalars)
    return _parquet_column(origin, path, text_field, is_string, "a string",
                           lambda column: column.to_numpy(zero_copy_only=False).tolist(),
                           "choose one with --text_field")


def parquet_lists(origin: str, path: Path, name: str, hint: str) -> Iterator[list | None]:
    """The column `name` of a Parquet file, a list (of structs: a conversation's messages) per
    row as Python lists and dicts; refuses a file without the column (`hint` saying what to
    do) or with a column that is not a list."""
    import pyarrow as pa

    def is_list(kind: pa.DataType) -> bool:
        return pa.types.is_list(kind) or pa.types.is_large_list(kind)

    return _parquet_column(origin, path, name, is_list, "a list",
                           lambda column: column.to_pylist(), hint)


def _parquet_column(origin: str, path: Path, name: str, accepts: Callable[[Any], bool],
                    wanted: str, convert: Callable[[Any], list], hint: str) -> Iterator[Any]:
    """The column `name` of a Parquet file, row group by row group, `convert`ed to Python
    values a batch at a time; its type must be one `accepts`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # Reads of 1 MiB, a column chunk when it is needed (not the row group's all at once)
        pf = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"--source {origin!r}: not a readable Parquet file: {first_line(e)}"
        ) from None
    schema = pf.schema_arrow
    if name not in schema.names:
        raise InputError(f"--source {origin!r}: no column {name!r} (its columns: "
                         f"{', '.join(schema.names) or 'none'}); {hint}")
    kind = schema.field(name).type
    if not accepts(kind):
        raise InputError(f"--source {origin!r}: column {name!r} is {kind}, not {wanted}")

    def batches() -> Iterator[list[Any]]:
        for group in range(pf.num_row_groups):
            for batch in pf.iter_batches(ROWS, row_groups=[group], columns=[name]):
                yield convert(batch.column(0))

    try:
        # decoded on a thread of its own while the batch before is cleaned
        with contextlib.closing(ahead(batches(), depth=1)) as decoded:
            for values in decoded:
                yield from values
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"--source {origin!r}: corrupt Parquet data: {first_line(e)}") from None


def clean_record(text: str) -> tuple[str, dict[str, int]]:
    """A record's text cleaned as a document is (BOM, line breaks, Gutenberg's wrapper), or ""
    where nothing is left. Most records hold none of these: they are kept as they are, at the
    cost of three searches."""
    if "\r" not in text and "***" not in text and not text.startswith("\ufeff"):
        return text, {}
    try:
        return clean(text, nul_ok=True)
    except InputError:  # no text left after cleaning
        return "", {}


def write_documents(
    origin: str, texts: Iterable[str | None], write: Callable[[bytes], object], after: bool,
    max_bytes: int, progress: Callable[[int], None] = lambda n: None,
    separator_at: Callable[[int], None] = lambda ahead: None,
) -> Records:
    """Clean each record's text and write it as a document, SEPARATOR between documents (and
    before the first one `after` an earlier document), telling `separator_at` where each
    starts: how many bytes after what `write` has been given so far; skip (and count) null and
    empty records. More than `max_bytes` of text is refused. Documents are handed to `write`
    about WRITE_BYTES at a time."""
    out, pending, held, ahead = Records(), [], 0, 0
    for text in texts:
        if not text or text.isspace():
            out.skip("null" if text is None else "empty")
            continue
        kept, removed = clean_record(text)
        if not kept or kept.isspace():
            out.skip("empty")
            continue
        for k, v in removed.items():
            out.removed[k] = out.removed.get(k, 0) + v
        data = kept.encode("utf-8")
        if after or out.documents:
            separator_at(ahead)
            pending.append(SEPARATOR)
            ahead += len(SEPARATOR)
        pending.append(data)
        ahead += len(data)
        out.documents += 1
        out.kept_bytes += len(data)
        held += len(data)
        if out.kept_bytes > max_bytes:
            raise InputError(
                f"--source {origin!r}: more than --max_bytes {max_bytes} bytes of text"
            )
        if held >= WRITE_BYTES:
            write(b"".join(pending))
            progress(held)
            pending, held, ahead = [], 0, 0
    if pending:
        write(b"".join(pending))
        progress(held)
    return out
