"""Corpus stage: MB/s to read, clean, split, tokenize and write a text, per tokenizer."""

from __future__ import annotations

import contextlib
import io
import tempfile
from importlib import resources

from bench.harness import SHARED, Result, Stats, fmt_stats, repeat, timed
from gpt.config import CorpusConfig
from gpt.corpus import main as corpus_main
from gpt.sources import EMBEDDED_ASSET

PLAYS = SHARED / "data" / "shakespeare_plays.txt"
CASES = [("gpt2", True), ("gpt2", False), ("char", False)]


def run(quick: bool) -> Result:
    source = PLAYS if PLAYS.exists() else None  # else the embedded default
    embedded = resources.files("gpt.assets") / EMBEDDED_ASSET
    size = source.stat().st_size if source else len(embedded.read_bytes())
    repeats = 1 if quick else 3
    result = Result(
        "corpus",
        {"source": str(source or "default"), "bytes": size, "repeats": repeats, "warmup": 1},
        ["tokenizer", "compact", "seconds", "MB/s"],
    )
    for tokenizer, compact in CASES:
        if quick and not compact and tokenizer == "gpt2":
            continue

        def once(tokenizer: str = tokenizer, compact: bool = compact) -> float:
            with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(io.StringIO()):
                cfg = CorpusConfig(
                    root=root, run="bench", source=str(source or "default"),
                    tokenizer=tokenizer, compact=compact, block_size=64,
                )
                return timed(lambda: corpus_main(cfg))

        seconds = repeat(once, warmup=1, repeats=repeats)
        mbps = [size / 1e6 / s for s in seconds.values]

        result.rows.append(
            {
                "tokenizer": tokenizer,
                "compact": compact,
                "seconds": fmt_stats(seconds, " s"),
                "MB/s": fmt_stats(Stats(mbps)),
                "mb_per_s": Stats(mbps).as_dict(),
            }
        )
    return result
