"""Records as documents: each JSON Lines line's or Parquet row's --text_field is one document,
cleaned on its own; null and empty records are skipped and counted; every malformed record or
file is refused with one line naming the file, the line (or the columns) and the reason; the
readers stream, in memory a whole-file read would exceed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import zstandard
from support.corpora import ids_between, jsonl, parquet, read, refusal, split_documents
from support.paths import FIXTURES, PROJECT

from gpt.config.configs import CorpusConfig
from gpt.data import records
from gpt.data.sources import Download
from gpt.errors import InputError
from gpt.load_corpus import main as load_corpus
from gpt.tokenizer.kinds import load_tokenizer

GUTENBERG = (FIXTURES / "gutenberg_sample.txt").read_text()


def test_each_record_is_cleaned_on_its_own_and_null_or_empty_ones_are_counted(tmp_path):
    docs = ["plain", None, "", "  \n ", "dos\r\nline\rend", GUTENBERG, "\ufeffbom", "last"]
    (tmp_path / "r.jsonl").write_bytes(jsonl(docs))
    (tmp_path / "s.parquet").write_bytes(parquet(docs))
    for name in ("r.jsonl", "s.parquet"):
        text, (doc,) = read(tmp_path / name)
        parts = text.split("\n\n")
        assert parts[:2] == ["plain", "dos\nline\nend"]  # line breaks normalised
        assert parts[2].startswith("SONNET XVIII") and "Project Gutenberg" not in text
        assert parts[-2:] == ["bom", "last"]
        assert doc.documents == 5 and doc.skipped == {"null": 1, "empty": 2}
        assert doc.removed["newlines_normalised"] == 2 and doc.removed["bom"] == 1
        assert doc.removed["gutenberg_header_chars"] > 0


def test_text_field_names_the_field(tmp_path):
    (tmp_path / "r.jsonl").write_bytes(jsonl(["a", "b"], field="content"))
    (tmp_path / "s.parquet").write_bytes(parquet(["c"], field="content"))
    assert read(tmp_path, text_field="content")[0] == "a\n\nb\n\nc"


def test_blank_lines_and_crlf_line_ends_are_json_lines_still(tmp_path):
    (tmp_path / "r.jsonl").write_bytes(b'{"text": "a"}\r\n\n  \n{"text": "b"}')  # no final \n
    assert read(tmp_path / "r.jsonl")[0] == "a\n\nb"


@pytest.mark.parametrize(("lines", "says"), [
    (b'{"text": "a"}\n{"id": 1}\n{"text": "b"}\n{"txt": "c"}\n',
     "2 record(s) without the field 'text' (the first on line 2); choose it with --text_field"),
    (b'{"text": "a"}\n{"text": 42}\n', "line 2: field 'text' is a JSON number, not a string"),
    (b'{"text": ["a"]}\n', "line 1: field 'text' is a JSON array, not a string"),
    (b'{"text": "a"}\n{"text": "b\n', "invalid JSON on line 2"),
    (b'{"text": "a"}\n\n{"text": "b"} trailing\n', "invalid JSON on line 3"),
    (b'["a", "b"]\n', "line 1 is a JSON array, not an object (JSON Lines: one object a line)"),
    (b'[\n {"text": "a"}\n]\n', "a JSON array, not JSON Lines (one object a line)"),
    (b'{"text": "\xff"}\n', "invalid JSON on line 1"),
    (b'{"text": "a"}\n{"text": "lone \\ud800 surrogate"}\n', "invalid JSON on line 2"),
    (b'{"text": "a", "tree": ' + b"[" * 1100 + b"]" * 1100 + b"}\n",
     "invalid JSON on line 1: depth limit exceeded"),
])  # fmt: skip
def test_a_malformed_json_lines_file_is_refused_naming_the_line(lines, says, tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(lines)
    message = refusal(tmp_path / "bad.jsonl")
    assert message.startswith(f"--source {str(tmp_path / 'bad.jsonl')!r}: ") and says in message


def test_deep_nesting_is_refused_whatever_the_recursion_limit(tmp_path):
    """torch.compile raises the interpreter's recursion limit to 2000 in the process that ran
    it; the standard json's depth follows that limit, orjson's (1024) does not: the same line is
    refused either way (it once passed in a pytest worker that had compiled a model)."""
    (tmp_path / "deep.jsonl").write_bytes(b'{"text": "a", "tree": ' + b"[" * 1100
                                          + b"]" * 1100 + b"}\n")
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, 5000))
    try:
        assert "depth limit exceeded" in refusal(tmp_path / "deep.jsonl")
    finally:
        sys.setrecursionlimit(before)


def test_json_the_fast_parser_refuses_is_read_by_the_standard_one(tmp_path):
    # orjson refuses integers past 64 bits and NaN, which the standard json reads
    (tmp_path / "r.jsonl").write_bytes(
        b'{"id": 123456789012345678901234567890, "text": "big id"}\n'
        b'{"score": NaN, "text": "not a number"}\n'
        b'{"note": "\\ud83d\\ude00", "text": "a pair is a character: \\ud83d\\ude00"}\n')
    text, (doc,) = read(tmp_path / "r.jsonl")
    assert text.split("\n\n") == ["big id", "not a number", "a pair is a character: \U0001f600"]
    assert doc.documents == 3


def test_a_line_longer_than_the_limit_is_refused_not_held(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_LINE", 1000)
    (tmp_path / "long.jsonl").write_bytes(b'{"text": "a"}\n{"text": "' + b"x" * 5000)
    assert "line 2 is longer than 1,000 bytes" in refusal(tmp_path / "long.jsonl")


def test_a_parquet_file_without_the_column_lists_its_columns(tmp_path):
    (tmp_path / "p.parquet").write_bytes(parquet(["a"], field="content"))
    assert "no column 'text' (its columns: id, content); choose one with --text_field" in (
        refusal(tmp_path / "p.parquet"))
    assert "column 'id' is int64, not a string" in refusal(tmp_path / "p.parquet", text_field="id")


def test_a_corrupt_parquet_file_is_refused(tmp_path):
    data = bytearray(parquet(["some text"] * 200, row_group_size=50))
    data[len(data) - 12 : len(data) - 8] = b"\xff\xff\xff\x7f"  # the footer's length
    (tmp_path / "p.parquet").write_bytes(bytes(data))
    assert "not a readable Parquet file" in refusal(tmp_path / "p.parquet")


def test_a_refusal_midway_through_parquet_stops_its_reading_thread(tmp_path):
    # 2 MB of text in a file of 200 KB
    (tmp_path / "p.parquet").write_bytes(parquet([f"{i} " + "x" * 1000 for i in range(2000)],
                                                 row_group_size=100))
    try:
        read(tmp_path / "p.parquet", dl=Download(max_bytes=500_000))
    except InputError as e:  # checked while the error (and its frames) is held
        assert "more than --max_bytes 500000 bytes of text" in str(e)
        assert not [t for t in threading.enumerate() if t.name == "read-ahead"]
    else:
        pytest.fail("read past --max_bytes")


@pytest.mark.parametrize("content", [jsonl([None, "", " "]), b"", b"\n\n"])
def test_an_empty_dataset_is_refused(content, tmp_path):
    (tmp_path / "a.jsonl").write_bytes(content)
    (tmp_path / "b.parquet").write_bytes(parquet([None, ""]))
    message = refusal(tmp_path)
    assert "empty dataset: no document with text" in message


def test_load_corpus_records_each_file_with_its_documents(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    comedy = (PROJECT / "gpt" / "assets" / "comedy_of_errors.txt").read_text()
    paras = [p for p in comedy.split("\n\n") if p.strip()]
    (folder / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(paras)))
    (folder / "b.parquet").write_bytes(parquet(paras[:100] + [None], row_group_size=32))
    cfg = CorpusConfig(root=str(tmp_path / "root"), run="r", source=str(folder), block_size=16)
    load_corpus(cfg)
    record = json.loads(cfg.rundir.source_json.read_text())
    assert record["text_field"] == "text"
    assert [(d["format"], d["documents"], d["skipped"]) for d in record["documents"]] == [
        ("jsonl+zstd", len(paras), {}), ("parquet", 100, {"null": 1})]
    text = cfg.rundir.text_txt.read_text()
    docs = paras + paras[:100]
    assert text == "\n\n".join(docs)
    # Each record encoded on its own, end-of-text between two (across files too), as many
    # documents in meta.json as source.json's files hold.
    meta = json.loads(cfg.rundir.meta_json.read_text())
    assert meta["documents"] == sum(d["documents"] for d in record["documents"]) == len(docs)
    tok = load_tokenizer(cfg.rundir.tokenizer_json)
    ids = [np.fromfile(f, dtype=meta["dtype"]).tolist()
           for f in (cfg.rundir.train_bin, cfg.rundir.val_bin)]  # fmt: skip
    splits = split_documents(docs, int(len(text) * 0.9))
    assert ids == [ids_between(s, tok.encode, tok.eot_id) for s in splits]


@pytest.mark.process
def test_the_cli_refuses_with_one_line_exit_2_and_writes_nothing(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "fine"}\n{"text": 1}\n')
    root = tmp_path / "root"
    done = subprocess.run(
        [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", "r",
         "--source", str(tmp_path / "bad.jsonl")],
        capture_output=True, text=True, timeout=120, cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "line 2: field 'text' is a JSON number, not a string")
    assert not (root / "r" / "corpus").exists() and not (root / "r" / "data").exists()


# -- bounded memory: a child reads 96 MB of text into a sink and says how much it grew -

CHILD = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    import json, pyarrow.parquet, zstandard  # imported before the baseline
    from gpt.data.sources import Download, read_source
    def status(key):  # MB
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key)) // 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from here: imports' transient peaks aside
    base = status("VmRSS:")
    n = [0]
    def sink(data): n[0] += len(data)
    with tempfile.TemporaryDirectory() as scratch:
        read_source(sys.argv[1], Download(max_bytes=10**9), Path(scratch), sink)
    print(base, status("VmHWM:"), n[0])
""")


@pytest.mark.process
@pytest.mark.parametrize("name", ["big.jsonl.zst", "big.parquet"])
def test_a_reader_streams_in_memory_far_below_the_file(name, tmp_path):
    line = (PROJECT / "gpt" / "assets" / "comedy_of_errors.txt").read_text()[:4000]
    docs = [f"{i} {line}" for i in range(24_000)]  # 96 MB of text
    path = tmp_path / name
    if name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor(level=1).compress(jsonl(docs)))
    else:
        path.write_bytes(parquet(docs, row_group_size=500))  # 2 MB row groups
    del docs
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=120, cwd=PROJECT,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    base, peak, nbytes = map(int, done.stdout.split())
    assert nbytes > 96_000_000
    # A whole-file read grows by the text at least (Parquet: Arrow's column and Python's
    # strings, twice it); streamed, the zstd reader grows ~18 MB, Parquet's ~50 MB (the
    # allocator's retained pages, the same for 4x the file: bench/corpus_speed.py).
    assert peak - base < 80, f"grew {peak - base} MB reading {nbytes / 1e6:.0f} MB"
