"""The load-corpus stage: outputs, the split, idempotency, and bad input leaving nothing behind."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from support.corpora import ids_between, split_documents
from support.paths import FIXTURES

import gpt.data.corpus
from gpt.config.configs import CorpusConfig
from gpt.data.cleaning import clean
from gpt.data.sources import EMBEDDED_ASSET
from gpt.errors import InputError
from gpt.load_corpus import main
from gpt.tokenizer.kinds import load_tokenizer

COMEDY_SHA256 = "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpt", "load-corpus", *args], capture_output=True, text=True
    )


def contents(path: Path) -> dict[str, bytes]:
    """Every file under `path` with its bytes."""
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): p.read_bytes() for p in files}


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under `path` with its inode and mtime: equal trees mean nothing was rewritten."""
    return {
        str(p.relative_to(path)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }


@pytest.mark.parametrize("tokenizer", ["gpt2", "char"])
def test_embedded_default_end_to_end(root: Path, tokenizer: str) -> None:
    cfg = CorpusConfig(root=str(root), run="r", tokenizer=tokenizer)
    main(cfg)
    rd = cfg.rundir
    meta = json.loads(rd.meta_json.read_text())
    text = rd.text_txt.read_text(encoding="utf-8")
    assert meta["corpus_sha256"] == COMEDY_SHA256  # the embedded text needs no cleaning
    assert (meta["tokenizer"], meta["source"], meta["dtype"]) == (tokenizer, "default", "uint16")

    tok = load_tokenizer(rd.tokenizer_json)
    assert tok.vocab_size == meta["vocab_size"]
    train = np.memmap(rd.train_bin, dtype=meta["dtype"], mode="r")
    val = np.memmap(rd.val_bin, dtype=meta["dtype"], mode="r")
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert max(train.max(), val.max()) < tok.vocab_size
    # Validation is the last 10% of the text by position; each split decodes back exactly.
    train_text, val_text = tok.decode(train.tolist()), tok.decode(val.tolist())
    assert train_text + val_text == text
    assert len(val_text) == len(text) - int(len(text) * 0.9)
    assert (meta["train_bytes"], meta["val_bytes"]) == (len(train_text), len(val_text))
    source = json.loads(rd.source_json.read_text())
    assert source["sha256"] == COMEDY_SHA256 and source["kind"] == "embedded"
    assert "documents" not in meta  # one document: meta.json as it always was


def test_compaction_shrinks_the_vocabulary(root: Path) -> None:
    sizes = {}
    for compact in (True, False):
        cfg = CorpusConfig(root=str(root), run=f"c{compact}", compact=compact)
        main(cfg)
        meta = json.loads(cfg.rundir.meta_json.read_text())
        sizes[compact] = (meta["vocab_size"], meta["train_tokens"], meta["val_tokens"])
    assert sizes[False][0] == 50257
    assert 256 < sizes[True][0] < 5000
    assert sizes[True][1:] == sizes[False][1:]  # compaction renumbers, it never re-tokenizes


def test_max_vocab_caps_the_vocabulary_and_is_an_input(root: Path) -> None:
    cfg = CorpusConfig(root=str(root), run="r", max_vocab=1024)
    main(cfg)
    meta = json.loads(cfg.rundir.meta_json.read_text())
    assert meta["vocab_size"] == load_tokenizer(cfg.rundir.tokenizer_json).vocab_size == 1024
    with pytest.raises(InputError, match="max_vocab 1024 there, 2048 now"):
        main(CorpusConfig(root=str(root), run="r", max_vocab=2048))
    # Ignored (and recorded as 0) where it does not apply.
    cfg = CorpusConfig(root=str(root), run="c", tokenizer="char", max_vocab=1024)
    main(cfg)
    assert json.loads(cfg.rundir.meta_json.read_text())["max_vocab"] == 0


@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.5])
def test_split_is_by_position(root: Path, fraction: float) -> None:
    cfg = CorpusConfig(root=str(root), run="r", tokenizer="char", val_fraction=fraction)
    main(cfg)
    text = cfg.rundir.text_txt.read_text(encoding="utf-8")
    tok = load_tokenizer(cfg.rundir.tokenizer_json)
    dtype = json.loads(cfg.rundir.meta_json.read_text())["dtype"]
    train, val = (tok.decode(np.fromfile(f, dtype=dtype).tolist())
                  for f in (cfg.rundir.train_bin, cfg.rundir.val_bin))
    assert train + val == text
    assert len(val) == len(text) - int(len(text) * (1 - fraction))


def test_directory_of_gutenberg_texts(root: Path, tmp_path: Path) -> None:
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_bytes((FIXTURES / "gutenberg_sample.txt").read_bytes())
    (books / "b.txt").write_text("Second book.\n" * 20)
    cfg = CorpusConfig(root=str(root), run="d", source=str(books), block_size=16)
    main(cfg)
    text = cfg.rundir.text_txt.read_text()
    assert "MERCHANTABILITY" not in text and "Gutenberg" not in text
    assert text.startswith("SONNET XVIII") and text.endswith("Second book.\n")
    docs = json.loads(cfg.rundir.source_json.read_text())["documents"]
    assert [Path(d["origin"]).name for d in docs] == ["a.txt", "b.txt"]
    assert docs[0]["removed"]["gutenberg_footer_chars"] > 0
    # The token files: each book encoded on its own, end-of-text between them (in train).
    books_text = [clean((books / "a.txt").read_text())[0], "Second book.\n" * 20]
    assert text == "\n\n".join(books_text)
    meta = json.loads(cfg.rundir.meta_json.read_text())
    tok = load_tokenizer(cfg.rundir.tokenizer_json)
    splits = split_documents(books_text, int(len(text) * 0.9))
    assert [len(s) for s in splits] == [2, 1]
    assert token_ids(cfg) == [ids_between(s, tok.encode, tok.eot_id) for s in splits]
    assert meta["documents"] == 2
    # Data made before documents were told apart (no `documents`: one stream) is other data.
    del meta["documents"]
    cfg.rundir.meta_json.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="documents 1 there, 2 now"):
        main(cfg)


def token_ids(cfg: CorpusConfig) -> list[list[int]]:
    dtype = json.loads(cfg.rundir.meta_json.read_text())["dtype"]
    return [np.fromfile(f, dtype=dtype).tolist()
            for f in (cfg.rundir.train_bin, cfg.rundir.val_bin)]  # fmt: skip


def test_rerun_same_inputs_is_a_no_op(root: Path, capsys) -> None:
    cfg = CorpusConfig(root=str(root), run="r", tokenizer="char")
    main(cfg)
    before = tree(cfg.rundir.path)
    main(CorpusConfig(root=str(root), run="r", tokenizer="char"))
    assert "already up to date" in capsys.readouterr().out
    assert tree(cfg.rundir.path) == before


def test_different_inputs_need_overwrite(root: Path) -> None:
    main(CorpusConfig(root=str(root), run="r", tokenizer="char"))
    rd = CorpusConfig(root=str(root), run="r").rundir
    before = tree(rd.path)
    with pytest.raises(InputError, match="other inputs .*tokenizer 'char' there, 'gpt2' now"):
        main(CorpusConfig(root=str(root), run="r", tokenizer="gpt2"))
    assert tree(rd.path) == before
    main(CorpusConfig(root=str(root), run="r", tokenizer="gpt2", overwrite=True))
    assert json.loads(rd.meta_json.read_text())["tokenizer"] == "gpt2"
    assert sorted(p.name for p in rd.path.iterdir()) == ["corpus", "data"]  # no staging left


def test_a_write_cut_between_its_two_renames_is_finished_by_the_same_command(
    root: Path, capsys
) -> None:
    # data/ is renamed into place before corpus/: a kill between the two leaves data/ alone.
    main(CorpusConfig(root=str(root), run="clean", tokenizer="char"))
    cfg = CorpusConfig(root=str(root), run="r", tokenizer="char")
    main(cfg)
    shutil.rmtree(cfg.rundir.corpus_dir)
    with pytest.raises(InputError, match="other inputs .*tokenizer 'char' there, 'gpt2' now"):
        main(CorpusConfig(root=str(root), run="r", tokenizer="gpt2"))
    main(cfg)
    assert "left incomplete by an interrupted run" in capsys.readouterr().out
    assert contents(cfg.rundir.path) == contents(root / "clean")


def test_an_overwrite_cut_between_its_renames_never_passes_for_up_to_date(root: Path) -> None:
    # --overwrite from the comedy to another text, killed between the renames: the new data/
    # beside the old corpus/. The new command run again must not take that pair as done.
    other = root / "other.txt"
    other.write_text("one two three four five six seven eight nine ten " * 40)
    main(CorpusConfig(root=str(root), run="clean", source=str(other), block_size=8))
    main(CorpusConfig(root=str(root), run="r", block_size=8))
    rd = CorpusConfig(root=str(root), run="r").rundir
    comedy_corpus = root / "comedy-corpus"
    shutil.copytree(rd.corpus_dir, comedy_corpus)
    cfg = CorpusConfig(root=str(root), run="r", source=str(other), block_size=8, overwrite=True)
    main(cfg)
    shutil.rmtree(rd.corpus_dir)
    comedy_corpus.rename(rd.corpus_dir)
    main(dataclasses.replace(cfg, overwrite=False))
    assert contents(rd.path) == contents(root / "clean")


def test_changed_file_content_is_a_different_input(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "t.txt"
    src.write_text("one two three four five six seven eight nine ten " * 10)
    main(CorpusConfig(root=str(root), run="r", source=str(src), block_size=8))
    src.write_text("ten nine eight seven six five four three two one " * 10)
    with pytest.raises(InputError, match="corpus_sha256"):
        main(CorpusConfig(root=str(root), run="r", source=str(src), block_size=8))


def test_failure_while_writing_leaves_old_data_intact(root: Path, monkeypatch) -> None:
    cfg = CorpusConfig(root=str(root), run="r", tokenizer="char")
    main(cfg)
    before = tree(cfg.rundir.path)

    def broken(path: Path, obj: object, what: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(gpt.data.corpus, "write_json", broken)
    with pytest.raises(OSError, match="disk full"):
        main(CorpusConfig(root=str(root), run="r", overwrite=True))
    assert tree(cfg.rundir.path) == before
    with pytest.raises(OSError, match="disk full"):
        main(CorpusConfig(root=str(root), run="fresh"))
    assert list((root / "fresh").rglob("*")) == []


def test_invalid_flags_name_the_flag() -> None:
    for kwargs, flag in [
        ({"val_fraction": 1.0}, "--val_fraction"),
        ({"val_fraction": 0.0}, "--val_fraction"),
        ({"block_size": 0}, "--block_size"),
        ({"max_vocab": 256}, "--max_vocab"),
        ({"download_timeout": 0.0}, "--download_timeout"),
        ({"download_retries": -1}, "--download_retries"),
        ({"max_bytes": 0}, "--max_bytes"),
    ]:
        with pytest.raises(ValueError, match=flag):
            CorpusConfig(**kwargs)


# -- the command line: one line on stderr naming the input, exit 2, nothing in the run directory


def bad_sources(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    (tmp_path / "binary.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    (tmp_path / "short.txt").write_text("Too short to learn from.")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "missing": ([str(tmp_path / "absent.txt")], "no such file or directory"),
        "empty": ([str(tmp_path / "empty.txt")], "empty"),
        "non-utf8": ([str(tmp_path / "latin1.txt")], "not UTF-8 text"),
        "binary": ([str(tmp_path / "binary.txt")], "binary file"),
        "scheme": (["ftp://example.org/pg1504.txt"], "scheme 'ftp' is not supported"),
        "unreachable": (
            [f"http://127.0.0.1:{port}/pg.txt", "--download_retries", "1"],
            "unreachable after 2 attempt",
        ),
        "too-short": ([str(tmp_path / "short.txt"), "--block_size", "8"], "too short"),
        "too-big": ([str(tmp_path / "short.txt"), "--max_bytes", "5"], "exceeds --max_bytes 5"),
    }


@pytest.mark.process
@pytest.mark.parametrize(
    "case",
    ["missing", "empty", "non-utf8", "binary", "scheme", "unreachable", "too-short", "too-big"],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    case: str, root: Path, tmp_path: Path
) -> None:
    source, reason = bad_sources(tmp_path)[case]
    out = run_cli(
        "--root", str(root), "--run", "bad", "--download_backoff", "0.05", "--source", *source
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], out.stderr
    assert source[0] in lines[0]
    assert not (root / "bad").exists()


@pytest.mark.process
def test_cli_demo_prints_counts_and_where_it_wrote(root: Path) -> None:
    out = run_cli("--root", str(root), "--run", "demo", "--tokenizer", "char")
    assert out.returncode == 0, out.stderr
    meta = json.loads((root / "demo" / "data" / "meta.json").read_text())
    assert f"train {meta['train_tokens']:,} tokens" in out.stdout
    assert str(root / "demo" / "data") in out.stdout
    again = run_cli("--root", str(root), "--run", "demo", "--tokenizer", "char")
    assert again.returncode == 0 and "already up to date" in again.stdout
    other = run_cli("--root", str(root), "--run", "demo", "--val_fraction", "0.2")
    assert other.returncode == 2 and "--overwrite" in other.stderr


@pytest.mark.process
def test_cli_help_lists_every_flag() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for flag in CorpusConfig.__dataclass_fields__:
        assert f"--{flag}" in out.stdout


@pytest.mark.process
def test_cli_reads_a_local_file(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "sonnets.txt"
    src.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "gutenberg_sample.txt").read_bytes())
    out = run_cli("--root", str(root), "--run", "f", "--source", str(src), "--block_size", "32")
    assert out.returncode == 0, out.stderr
    assert f"read {src} (file)" in out.stdout and "bom 1" in out.stdout
    text = (root / "f" / "corpus" / "text.txt").read_text(encoding="utf-8")
    assert text.startswith("SONNET XVIII") and "MERCHANTABILITY" not in text


# -- at scale: many files, a large corpus in bounded memory, a kill mid-way


def test_a_directory_of_thousands_of_files_each_cleaned_on_its_own(
    root: Path, tmp_path: Path
) -> None:
    books = tmp_path / "books"
    books.mkdir()
    sample = (FIXTURES / "gutenberg_sample.txt").read_bytes()
    expected = {}
    for i in reversed(range(2000)):  # written in reverse: the order is the names', not the disk's
        name = f"book{i:04d}.txt"
        if i % 3 == 0:  # wrapped by Gutenberg: its own header and footer go
            raw = sample.replace(b"SONNET XVIII", f"SONNET {i}".encode())
        else:
            raw = f"Book {i}.\r\nIts only line.\r\n".encode()
        (books / name).write_bytes(raw)
        expected[name] = clean(raw.decode())[0]
    cfg = CorpusConfig(root=str(root), run="many", source=str(books), block_size=16)
    main(cfg)
    text = cfg.rundir.text_txt.read_text(encoding="utf-8")
    assert text == "\n\n".join(expected[name] for name in sorted(expected))
    docs = json.loads(cfg.rundir.source_json.read_text())["documents"]
    assert [Path(d["origin"]).name for d in docs] == sorted(expected)
    assert sum("gutenberg_footer_chars" in d["removed"] for d in docs) == 667
    assert text.count("MERCHANTABILITY") == 0 and text.count("SONNET") == 2 * 667  # two each
    tok = load_tokenizer(cfg.rundir.tokenizer_json)
    splits = split_documents([expected[name] for name in sorted(expected)], int(len(text) * 0.9))
    assert token_ids(cfg) == [ids_between(s, tok.encode, tok.eot_id) for s in splits]
    assert json.loads(cfg.rundir.meta_json.read_text())["documents"] == 2000


# Runs argv[1:] and prints its ru_maxrss (KiB). A child's ru_maxrss starts from its parent's
# high-water mark (the kernel keeps the old mm's when exec replaces it: fs/exec.c), so measured
# straight from this test process it would be pytest's own size; a small parent measures the
# stage alone.
_MEASURE = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:], "
            "stdout=subprocess.DEVNULL); _, status, usage = os.wait4(p.pid, 0); "
            "print(usage.ru_maxrss); sys.exit(os.waitstatus_to_exitcode(status))")


def peak_rss_mb(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Run `cmd` as a grandchild; its own peak resident memory (os.wait4's ru_maxrss) in MB."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True)
    return int(done.stdout.strip() or 0) * 1024 / 1e6, done


def big_text(path: Path, size: int) -> Path:
    unit = (resources.files("gpt.assets") / EMBEDDED_ASSET).read_bytes()
    with open(path, "wb") as f:
        for _ in range(size // len(unit) + 1):
            f.write(unit)
    return path


@pytest.mark.slow
def test_a_50_mb_corpus_loads_in_bounded_memory(root: Path, tmp_path: Path) -> None:
    """The whole stage (gpt2, compacted) on ~50 MB stays far below what holding it would take
    (the in-memory stage needed 25x its input: 1.25 GB here). The speed and memory at 1-2 GB are
    `make bench BENCH=corpus`'s (docs/performance.md); 200 MB here took a minute of CPU."""
    src = big_text(tmp_path / "big.txt", 50_000_000)
    rss, out = peak_rss_mb(
        [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", "big",
         "--source", str(src)]
    )
    assert out.returncode == 0, out.stderr
    meta = json.loads((root / "big" / "data" / "meta.json").read_text())
    assert meta["train_bytes"] + meta["val_bytes"] == src.stat().st_size
    assert meta["train_tokens"] > 10_000_000
    assert rss < 300, f"peak resident memory {rss:.0f} MB"


@pytest.mark.process
def test_a_kill_mid_way_leaves_nothing_and_the_next_run_sweeps_its_scratch(
    root: Path, tmp_path: Path
) -> None:
    src = big_text(tmp_path / "big.txt", 30_000_000)
    cmd = [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", "k",
           "--source", str(src)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(root.glob(".k.*.staging")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # well inside cleaning or tokenizing
    proc.kill()
    proc.wait()
    assert list(root.glob(".k.*.staging")), "the kill came too late to test anything"
    assert not (root / "k").exists() or not any((root / "k").iterdir())
    short = tmp_path / "short.txt"
    short.write_text("Enough words to make a small corpus of it. " * 50)
    again = run_cli("--root", str(root), "--run", "k", "--source", str(short), "--block_size", "8")
    assert again.returncode == 0, again.stderr
    assert not list(root.glob(".k.*")) and (root / "k" / "data" / "meta.json").exists()
