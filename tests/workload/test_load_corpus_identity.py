"""load-corpus's outputs are byte-identical to those of the in-memory stage it replaced.

`fixtures/corpus_digests.json` holds the sha256 of every file load-corpus wrote under `corpus/`
and `data/` for each case below, measured with the in-memory implementation (commit a355c1e,
before issue 13 made the stage stream); the compacted GPT-2 cases re-recorded when the compact
vocabulary became merge-closed (the tokens BPE merges through joined it, so that it has a
Hugging Face twin), and the `dir` cases when end-of-text went between documents (the GPT-2
token files; `documents` in each meta.json, the char token files unchanged); the other
full-vocabulary and char cases unchanged since. Paths in `meta.json`
and `source.json` depend on where the source lies, so they are replaced by `<SOURCE>` before
hashing. Re-record (only when an output is meant to change) with
`python tests/workload/test_load_corpus_identity.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

import pytest

# (not support.paths: run as a script, tests/ is not on sys.path)
PROJECT = Path(__file__).resolve().parents[2]
FIXTURES = PROJECT / "tests" / "fixtures"
sys.path.insert(0, str(PROJECT))  # run as a script to re-record

from gpt.config.configs import CorpusConfig  # noqa: E402
from gpt.load_corpus import main  # noqa: E402

DIGESTS = FIXTURES / "corpus_digests.json"
SHARED_DATA = PROJECT.parent / "shared" / "data"
TOKENIZERS = {
    "gpt2": {},
    "gpt2-all": {"max_vocab": 0},
    "gpt2-full": {"compact": False},
    "char": {"tokenizer": "char"},
}


def make_source(name: str, folder: Path) -> str | None:
    """The source of case `name`, written under `folder` if it is made here (None: unavailable)."""
    sample = (FIXTURES / "gutenberg_sample.txt").read_bytes()
    if name == "default":
        return "default"
    if name in ("comedy", "plays"):
        file = "comedy_of_errors.txt" if name == "comedy" else "shakespeare_plays.txt"
        path = SHARED_DATA / file
        return str(path) if path.exists() else None
    if name == "gutenberg-crlf-bom":
        # Cleaning's every branch: a BOM, CRLF and lone CR line breaks, Gutenberg's wrapper.
        path = folder / "sonnets.txt"
        body = sample.replace(b"\n", b"\r\n") + b"Last\rline\r\n" * 3
        path.write_bytes(b"\xef\xbb\xbf" + body)
        return str(path)
    if name == "dir":
        books = folder / "books"
        books.mkdir()
        (books / "a.txt").write_bytes(sample)
        (books / "b.txt").write_text("Second book.\n" * 20)
        (books / "c.txt").write_bytes(b"\xef\xbb\xbfThird\r\nbook \xc3\xa9\xe2\x82\xac.\r\n" * 30)
        (books / "skipped.md").write_text("not a .txt file")
        return str(books)
    raise ValueError(name)


SOURCES = ["default", "comedy", "plays", "gutenberg-crlf-bom", "dir"]
CASES = [f"{s}/{t}" for s in SOURCES for t in TOKENIZERS]


def digests(case: str, folder: Path) -> dict[str, str] | None:
    """sha256 of every file load-corpus writes for `case` (None if its source is unavailable)."""
    name, tokenizer = case.split("/")
    source = make_source(name, folder)
    if source is None:
        return None
    kwargs = {"tokenizer": "gpt2", **TOKENIZERS[tokenizer]}
    cfg = CorpusConfig(root=str(folder / "root"), run="r", source=source, block_size=16, **kwargs)
    with contextlib.redirect_stdout(io.StringIO()):
        main(cfg)
    resolved = str(Path(source).resolve()) if source != "default" else None
    out = {}
    for sub in ("corpus", "data"):
        for path in sorted((cfg.rundir.path / sub).iterdir()):
            data = path.read_bytes()
            if resolved and path.suffix == ".json":
                data = data.replace(resolved.encode(), b"<SOURCE>")
            out[f"{sub}/{path.name}"] = hashlib.sha256(data).hexdigest()
    return out


@pytest.mark.parametrize("case", CASES)
def test_outputs_are_byte_identical_to_the_in_memory_stage(case: str, tmp_path: Path) -> None:
    expected = json.loads(DIGESTS.read_text())["cases"][case]
    got = digests(case, tmp_path)
    if got is None:
        pytest.skip(f"{case}: {SHARED_DATA} is absent")
    assert got == expected


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        cases = {}
        for i, case in enumerate(CASES):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            cases[case] = digests(case, folder)
            print(case, "recorded" if cases[case] else "skipped (no source)")
    doc = {"measured_at": sys.argv[1] if len(sys.argv) > 1 else "", "cases": cases}
    DIGESTS.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
