"""Corpus files by format and compression: every format (text, JSON Lines, Parquet) in every
compression (none, gzip, zstd, bz2, xz) gives the same text; a name that lies about the bytes, a
truncated or corrupt stream and a compression bomb are refused with one line."""

from __future__ import annotations

import bz2
import gzip
import lzma
import tempfile
from pathlib import Path

import pytest
import zstandard
from support.corpora import DL, jsonl, parquet, read, refusal

from gpt.data.formats import Format, format_of, format_or_text
from gpt.data.sources import Download, read_source

DOCS = ["First document.\nTwo lines.", "Second, with ünïcödé and \"quotes\".", "Third\n\nparas."]
COMPRESS = {
    None: lambda b: b,
    "gzip": gzip.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
SUFFIX = {None: "", "gzip": ".gz", "zstd": ".zst", "bz2": ".bz2", "xz": ".xz"}


def raw(kind: str, docs: list[str]) -> bytes:
    if kind == "txt":
        return "\n\n".join(docs).encode()
    return jsonl(docs) if kind == "jsonl" else parquet(docs)


@pytest.mark.parametrize("compression", list(COMPRESS))
@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_every_format_in_every_compression_gives_the_same_text(kind, compression, tmp_path):
    name = {"txt": "c.txt", "jsonl": "c.jsonl", "parquet": "c.parquet"}[kind]
    path = tmp_path / (name + SUFFIX[compression])
    stored = COMPRESS[compression](raw(kind, DOCS))
    path.write_bytes(stored)
    text, (doc,) = read(path)
    assert text == "\n\n".join(DOCS)  # a blank line between documents, as between .txt files
    assert doc.raw_bytes == len(stored), "raw: the file as stored"
    fmt = kind + (f"+{compression}" if compression else "")
    assert doc.format == fmt and doc.documents == (1 if kind == "txt" else 3)
    record = doc.record()
    if fmt == "txt":  # a plain text's record is what it always was
        assert set(record) == {"origin", "raw_bytes", "raw_sha256", "kept_bytes", "removed"}
    else:
        assert record["format"] == fmt and record["documents"] == doc.documents


def test_names_say_the_format_and_other_files_are_none():
    assert format_of("a/b/shard-0001.JSONL.ZST") == Format("jsonl", "zstd")
    assert format_of("x.json.gz") == Format("jsonl", "gzip")
    assert format_of("train-00000-of-00002.parquet") == Format("parquet")
    assert format_of("book.txt.xz") == Format("txt", "xz")
    for other in ("README.md", ".gitattributes", "data.csv", "x.gz", "x.parquet.tmp"):
        assert format_of(other) is None
    # a single source's unknown name is plain text, as it always was (and still checked)
    assert format_or_text("https://example.org/pg1504") == Format("txt")
    assert format_or_text("notes.md.gz") == Format("txt", "gzip")


def test_a_directory_reads_its_corpus_files_of_any_format_in_name_order(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.jsonl.zst").write_bytes(COMPRESS["zstd"](jsonl(["beta", "gamma"])))
    (tmp_path / "c.parquet").write_bytes(parquet(["delta"]))
    (tmp_path / "d.json.gz").write_bytes(gzip.compress(jsonl(["epsilon"])))
    (tmp_path / "README.md").write_text("not read")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.jsonl").write_bytes(jsonl(["nested: not read"]))
    text, docs = read(tmp_path)
    assert text == "alpha\n\nbeta\n\ngamma\n\ndelta\n\nepsilon"
    assert [Path(d.origin).name for d in docs] == ["a.txt", "b.jsonl.zst", "c.parquet",
                                                    "d.json.gz"]  # fmt: skip
    assert [d.documents for d in docs] == [1, 2, 1, 1]


@pytest.mark.parametrize(("name", "data", "says"), [
    ("a.jsonl.gz", jsonl(DOCS), "named gzip but its bytes are not compressed"),
    ("a.jsonl.zst", gzip.compress(jsonl(DOCS)), "named zstd but its bytes are gzip data"),
    ("a.txt", gzip.compress(b"hello"), "named as txt but its bytes are gzip data"),
    ("a.jsonl", COMPRESS["zstd"](jsonl(DOCS)), "named as jsonl but its bytes are zstd data"),
    ("a.parquet", jsonl(DOCS), "named .parquet but its bytes are no Parquet file"),
    ("a.txt", parquet(DOCS), "named as txt but its bytes are parquet data"),
], ids=["gz-plain", "zst-gzip", "txt-gzip", "jsonl-zstd", "parquet-jsonl",
        "txt-parquet"])  # fmt: skip
# (ids of their own: gzip's header holds the time it was written, so ids made from the bytes
# differed between xdist's workers when they collected in different seconds, and make test
# stopped at collection)
def test_a_name_that_lies_about_the_bytes_is_refused(name, data, says, tmp_path):
    (tmp_path / name).write_bytes(data)
    assert says in refusal(tmp_path / name)


@pytest.mark.parametrize("compression", ["gzip", "zstd", "bz2", "xz"])
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_truncated_compressed_file_is_refused(kind, compression, tmp_path):
    whole = COMPRESS[compression](raw(kind, DOCS * 50))
    path = tmp_path / f"c.{kind}{SUFFIX[compression]}"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    assert f"truncated or corrupt {compression} data" in refusal(path)


@pytest.mark.parametrize("compression", ["gzip", "zstd", "bz2", "xz"])
def test_a_corrupt_compressed_file_is_refused(compression, tmp_path):
    whole = bytearray(COMPRESS[compression](raw("jsonl", DOCS * 50)))
    for at in range(len(whole) // 3, len(whole) // 3 + 24):
        whole[at] ^= 0x5A
    path = tmp_path / f"c.jsonl{SUFFIX[compression]}"
    path.write_bytes(bytes(whole))
    assert f"truncated or corrupt {compression} data" in refusal(path)


def test_several_concatenated_frames_are_one_stream(tmp_path):
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(COMPRESS["zstd"](jsonl(DOCS[:1])) + COMPRESS["zstd"](jsonl(DOCS[1:])))
    assert read(path)[0] == "\n\n".join(DOCS)
    gz = tmp_path / "c.txt.gz"
    gz.write_bytes(gzip.compress(b"one ") + gzip.compress(b"text"))
    assert read(gz)[0] == "one text"


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compression_bomb_stops_at_max_bytes(compression, tmp_path):
    path = tmp_path / f"zeros.txt{SUFFIX[compression]}"
    path.write_bytes(COMPRESS[compression](b"a" * 5_000_000))  # a few KB, 5 MB inside
    dl = Download(max_bytes=1_000_000)
    assert "decompresses to more than --max_bytes 1000000" in refusal(path, dl=dl)


def test_parquet_compressed_as_a_file_is_decompressed_to_disk_first(tmp_path):
    path = tmp_path / "c.parquet.zst"
    path.write_bytes(COMPRESS["zstd"](parquet(DOCS)))
    with tempfile.TemporaryDirectory() as scratch:
        pieces: list[bytes] = []
        read_source(str(path), DL, Path(scratch), pieces.append)
        assert not list(Path(scratch).iterdir()), "the decompressed copy is removed"
    assert b"".join(pieces).decode() == "\n\n".join(DOCS)
