"""Sources: the embedded text, files, directories and URLs (a local HTTP server); cleaning."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.web import GUTENBERG, Handler

import gpt.data.cleaning
import gpt.data.sources
from gpt.data.cleaning import clean
from gpt.data.sources import Document, Download, canonical, fetch_url, kind_of, read_document
from gpt.data.sources import read_source as stream_source
from gpt.errors import InputError

FAST = Download(timeout=2.0, retries=2, backoff=0.01, max_bytes=1_000_000)


def read_source(source: str, dl: Download) -> list[tuple[Document, str]]:
    """Each document of `source` with its cleaned text (read_source streams them into one)."""
    pieces: list[bytes] = []
    with tempfile.TemporaryDirectory() as scratch:
        docs = stream_source(source, dl, Path(scratch), pieces.append)
    whole, out, at = b"".join(pieces), [], 0
    for doc in docs:
        out.append((doc, whole[at : at + doc.kept_bytes].decode()))
        at += doc.kept_bytes + 2  # the blank line between documents
    return out


def to_document(origin: str, raw: bytes, folder: Path) -> str:
    """The cleaned text of a document of bytes `raw`."""
    path = folder / "doc"
    path.write_bytes(raw)
    pieces: list[bytes] = []
    read_document(origin, path, 1 << 20, pieces.append)
    return b"".join(pieces).decode()


def fetched(url: str, dl: Download, folder: Path) -> bytes:
    fetch_url(url, dl, folder / "download")
    return (folder / "download").read_bytes()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gutenberg_header_footer_and_licence_are_cut() -> None:
    text, removed = clean(GUTENBERG.decode())
    assert text.startswith("SONNET XVIII") and text.endswith("nor no man ever loved.")
    for boilerplate in ("MERCHANTABILITY", "Project Gutenberg", "*** START", "*** END", "LICENSE"):
        assert boilerplate not in text
    assert removed["gutenberg_header_chars"] > 0 and removed["gutenberg_footer_chars"] > 0


def test_bom_and_windows_newlines_are_normalised() -> None:
    raw = "\ufeff" + GUTENBERG.decode().replace("\n", "\r\n")
    text, removed = clean(raw)
    assert text == clean(GUTENBERG.decode())[0]
    assert removed["bom"] == 1 and removed["newlines_normalised"] == GUTENBERG.count(b"\n")
    assert clean("old\rmac\r") == ("old\nmac\n", {"newlines_normalised": 2})


def test_text_without_markers_is_kept_as_is() -> None:
    assert clean("  Just a text.\n\n") == ("  Just a text.\n\n", {})


def in_memory_cleaning(text: str) -> tuple[str, dict[str, int]]:
    """Cleaning as the in-memory stage did it, on the whole text at once (commit a355c1e,
    gpt/data/sources.py `clean`): the reference for the streamed cleaning."""
    removed: dict[str, int] = {}
    if text.startswith("\ufeff"):
        text = text[1:]
        removed["bom"] = 1
    crlf = text.count("\r\n")
    text = text.replace("\r\n", "\n")
    cr = text.count("\r")
    text = text.replace("\r", "\n")
    if crlf or cr:
        removed["newlines_normalised"] = crlf + cr
    marker = r"^\*{3}\s*%s OF (?:THE |THIS )?PROJECT GUTENBERG.*$"
    start = re.search(marker % "START", text, re.I | re.M)
    end = re.search(marker % "END", text, re.I | re.M)
    if start or end:
        lo = start.end() if start else 0
        hi = end.start() if end and end.start() >= lo else len(text)
        removed["gutenberg_header_chars"] = lo
        removed["gutenberg_footer_chars"] = len(text) - hi
        body = text[lo:hi]
        text = body.strip()
        removed["edge_whitespace_chars"] = len(body) - len(text)
    return text, removed


# Lines that exercise the marker search where chunks and long lines cut it.
LINES = [
    "A plain line of the book.", "", "   ", "*** START OF THE PROJECT GUTENBERG EBOOK X ***",
    "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "***", "*** ", "START OF THIS PROJECT "
    "GUTENBERG EBOOK", "END OF THE PROJECT GUTENBERG", "an * asterisk", "not *** START OF THE "
    "PROJECT GUTENBERG", "x" * 100, "caf\u00e9 \u20ac \u65e5\u672c\U0001f600",
    "*** START OF THE PROJECT GUTENBERG EBOOK " + "LONG TITLE " * 10 + "***",
]


@pytest.mark.parametrize("seed", range(40))
def test_streamed_cleaning_equals_cleaning_the_whole_text(
    seed: int, tmp_path: Path, monkeypatch
) -> None:
    """Documents read in chunks of 1 to 64 bytes, with lines longer than 40 characters searched
    in pieces (4 MB in use; a marker's words are shorter, so a cut never splits them), are
    cleaned exactly as the whole text at once: markers split across chunks and long lines, a
    "***" whose words follow on a later line, CRLF split between chunks, a BOM, a document with
    nothing to clean (copied byte for byte)."""
    rng = random.Random(seed)
    lines = rng.choices(LINES, k=rng.randint(1, 30))
    text = rng.choice(["\n", "\r\n", "\r"] if seed % 4 else ["\n"]).join(lines)
    text = ("\ufeff" if seed % 5 == 1 else "") + text + rng.choice(["", "\n"])
    monkeypatch.setattr(gpt.data.cleaning, "LONG_LINE", 40)
    expected, removed = in_memory_cleaning(text)
    for chunk in (1, 2, 3, 7, 64):
        monkeypatch.setattr(gpt.data.sources, "CHUNK", chunk)
        if expected.strip():
            got = to_document("doc", text.encode(), tmp_path)
            assert (got, seed, chunk) == (expected, seed, chunk)
            [(doc, _)] = read_source(str(tmp_path / "doc"), FAST)
            assert doc.removed == removed
        else:
            with pytest.raises(InputError, match="no text left after cleaning"):
                to_document("doc", text.encode(), tmp_path)


def test_embedded_default_needs_nothing_and_is_unchanged(shared: Path) -> None:
    for spelling in ("default", ""):
        [(doc, text)] = read_source(spelling, FAST)
        assert text.encode() == (shared / "data" / "comedy_of_errors.txt").read_bytes()
        assert doc.removed == {}
    assert canonical("") == canonical("default") == "default"


def test_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_bytes(GUTENBERG)
    (tmp_path / "notes.md").write_text("not a corpus")
    docs = read_source(str(tmp_path), FAST)
    assert [Path(d.origin).name for d, _ in docs] == ["a.txt", "b.txt"]
    assert docs[0][1].startswith("SONNET") and docs[1][1] == "second"
    [(one, _)] = read_source(str(tmp_path / "b.txt"), FAST)
    assert one.origin == str((tmp_path / "b.txt").resolve()) == canonical(str(tmp_path / "b.txt"))


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "empty"),
        (b"text\x00with a NUL", "binary file"),
        (b"caf\xe9 latin-1", "not UTF-8 text .byte 0xe9 at offset 3"),
        (
            b"*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n*** END OF THE PROJECT GUTENBERG",
            "no text",
        ),
    ],
)
def test_bad_bytes_are_refused(raw: bytes, reason: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=reason) as err:
        to_document("in.txt", raw, tmp_path)
    assert "'in.txt'" in str(err.value)


def test_bad_local_sources(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        kind_of(str(tmp_path / "absent.txt"))
    with pytest.raises(InputError, match="holds no"):
        read_source(str(tmp_path), FAST)
    (tmp_path / "big.txt").write_bytes(b"z" * 100)
    with pytest.raises(InputError, match="exceeds --max_bytes 99"):
        read_source(str(tmp_path / "big.txt"), Download(max_bytes=99))
    with pytest.raises(InputError, match="exceeds --max_bytes 99"):
        read_source(str(tmp_path), Download(max_bytes=99))


@pytest.mark.parametrize("url", ["ftp://example.org/a.txt", "file:///etc/hostname",
                                 "memory://b/k"])  # fmt: skip
def test_only_http_https_s3_and_gs_urls(url: str) -> None:
    with pytest.raises(InputError, match="scheme .* is not supported"):
        kind_of(url)


@pytest.mark.parametrize("uri,kind", [
    ("s3://b/k.txt", "object"), ("s3://b/texts/", "prefix"), ("s3://b", "prefix"),
    ("S3://b/", "prefix"), ("gs://b/a/k.txt", "object"), ("gs://b/a/", "prefix"),
])  # fmt: skip
def test_object_store_uris_are_told_apart_by_spelling_alone(uri: str, kind: str) -> None:
    assert kind_of(uri) == kind  # no network: the component image checks flags with this
    assert canonical(uri) == uri


def test_an_object_store_uri_needs_a_bucket() -> None:
    with pytest.raises(InputError, match="'s3:///k.txt': no bucket"):
        kind_of("s3:///k.txt")


def test_url_is_fetched_and_cleaned(web_server: str) -> None:
    [(doc, text)] = read_source(f"{web_server}/pg.txt", FAST)
    assert doc.origin == f"{web_server}/pg.txt" and doc.raw_bytes == len(GUTENBERG)
    assert text == clean(GUTENBERG.decode())[0]


def test_transient_failures_are_retried(web_server: str, tmp_path: Path) -> None:
    assert fetched(f"{web_server}/flaky", FAST, tmp_path) == GUTENBERG
    assert Handler.hits["/flaky"] == 3


def test_client_errors_are_not_retried(web_server: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="HTTP 404"):
        fetched(f"{web_server}/missing", FAST, tmp_path)
    assert Handler.hits["/missing"] == 1


def test_unreachable_url_after_bounded_retries_with_backoff(capsys, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/pg.txt"
    start = time.monotonic()
    with pytest.raises(InputError, match="unreachable after 3 attempt.*Connection"):
        fetched(url, Download(timeout=1.0, retries=2, backoff=0.2), tmp_path)
    assert time.monotonic() - start >= 0.2 + 0.4  # backoff doubles: 0.2 s, then 0.4 s
    assert capsys.readouterr().out.count("failed") == 3


def test_timeout(web_server: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unreachable after 1 attempt.*timed out"):
        fetched(f"{web_server}/slow", Download(timeout=0.2, retries=0), tmp_path)


@pytest.mark.parametrize("path", ["/big", "/stream"])
def test_size_cap(web_server: str, path: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--max_bytes 1000000"):
        fetched(f"{web_server}{path}", FAST, tmp_path)


@pytest.mark.process
def test_cli_trains_on_a_gutenberg_url_without_its_licence(web_server: str, root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", "url"]
        + ["--source", f"{web_server}/pg.txt", "--block_size", "32"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"read {web_server}/pg.txt (url)" in out.stdout
    assert "gutenberg_header_chars" in out.stdout
    text = (root / "url" / "corpus" / "text.txt").read_text()
    assert text == clean(GUTENBERG.decode())[0] and "MERCHANTABILITY" not in text
    source = json.loads((root / "url" / "corpus" / "source.json").read_text())
    assert source["kind"] == "url" and source["source"] == f"{web_server}/pg.txt"
    assert source["sha256"] == hashlib.sha256(text.encode()).hexdigest()


def _special_sources(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(source, what it is): a device, a FIFO (no writer: opening it would wait forever), a
    socket, and a directory whose *.txt is a FIFO."""
    yield "/dev/zero", "a character device"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    yield str(fifo), "a FIFO"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        yield str(tmp_path / "sock"), "a socket"
    finally:
        sock.close()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("Some text.\n" * 50)
    os.mkfifo(folder / "b.txt")
    yield str(folder), "a FIFO"


@pytest.mark.process
def test_special_files_are_refused_at_once_with_one_line(tmp_path: Path, root: Path) -> None:
    for source, what in _special_sources(tmp_path):
        started = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", "r",
             "--source", source], capture_output=True, text=True, timeout=60,
        )
        # the interpreter's start is most of it; reading /dev/zero or a FIFO would never end
        assert time.monotonic() - started < 30, source
        assert out.returncode == 2, (source, out.stderr)
        assert out.stderr.count("\n") == 1 and "--source '" in out.stderr
        assert f"{what}, not a regular file or directory" in out.stderr, out.stderr
        assert not (root / "r").exists()


def test_the_refusal_itself_takes_under_a_second(tmp_path: Path) -> None:
    for source, what in _special_sources(tmp_path):
        started = time.monotonic()
        with pytest.raises(InputError, match=what):
            read_source(source, FAST)
        assert time.monotonic() - started < 1.0, source


def test_a_file_read_stops_at_max_bytes_even_when_it_grows(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "growing.txt"
    path.write_bytes(b"a" * 10)
    real_stat = Path.stat

    def small_stat(self, *args, **kwargs):  # the size seen before the file grew
        st = real_stat(self, *args, **kwargs)
        return os.stat_result((*st[:6], 10, *st[7:])) if self == path else st

    path.write_bytes(b"a" * 1000)
    monkeypatch.setattr(Path, "stat", small_stat)
    with pytest.raises(InputError, match="more than --max_bytes 99 bytes"):
        read_source(str(path), Download(max_bytes=99))
