"""Corpus stage at scale: MB/s and peak resident memory at 5 MB, 100 MB (and 2 GB with
--large), per tokenizer, next to raw tiktoken on every core on the same text.

Each case runs `python -m gpt load-corpus` as a child process: its wall time gives MB/s (source
bytes over seconds, start-up included) and os.wait4's ru_maxrss its peak resident memory. Raw
tiktoken is `encode_ordinary_batch(..., num_threads=cores)` over the same file, also in a child,
timed over the encoding alone (the text read in 64 MB pieces cut at a newline, each encoded in
1 MB chunks): the speed the stage aims at (goal: at least 0.8x, in at most ~600 MB). This
machine's speed wanders by a quarter between runs, so each size runs in rounds (raw tiktoken,
then every case; three rounds where a run takes seconds, one at 2 GB) with raw tiktoken once
more at the end, and each case's median is compared with raw tiktoken's median; the peak
memory is the last round's.

The 100 MB and 2 GB texts are the Shakespeare plays repeated, written to a temporary directory
(the 2 GB one only with --large: `python -m bench.corpus_speed --large`, not in CI).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from bench.harness import SHARED, Result, Stats, fmt_stats
from gpt.data.sources import EMBEDDED_ASSET

PLAYS = SHARED / "data" / "shakespeare_plays.txt"
CASES = [("gpt2", True), ("gpt2", False), ("char", False)]
SIZES = {"5 MB": 5_000_000, "100 MB": 100_000_000, "2 GB": 2_000_000_000}
PROJECT = Path(__file__).resolve().parent.parent

# The raw tokenizer, alone: read the file in pieces, encode on every core, report the seconds.
RAW = """
import os, sys, time
from gpt.tokenizer.ranks import gpt2_encoding
enc, spent = gpt2_encoding(), 0.0
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    rest = ""
    while True:
        piece = f.read(1 << 26)
        text, rest = (rest + piece, "") if not piece else _split(rest + piece)
        chunks, i = [], 0
        while i < len(text):
            j = text.find("\\n", i + (1 << 20))
            j = len(text) if j < 0 else j + 1
            chunks.append(text[i:j])
            i = j
        t0 = time.perf_counter()
        enc.encode_ordinary_batch(chunks, num_threads=os.cpu_count())
        spent += time.perf_counter() - t0
        if not piece:
            break
print(spent)
"""
RAW_SPLIT = """
def _split(text):
    k = text.rfind("\\n") + 1 or len(text)
    return text[:k], text[k:]
"""


def source_text(size: int, folder: Path) -> Path:
    """A text of about `size` bytes: the plays (or the embedded corpus) repeated."""
    unit = PLAYS.read_bytes() if PLAYS.exists() else (
        resources.files("gpt.assets") / EMBEDDED_ASSET
    ).read_bytes()
    if size <= len(unit):
        path = PLAYS if PLAYS.exists() else folder / "text.txt"
        if not path.exists():
            path.write_bytes(unit)
        return path
    path = folder / f"text-{size}.txt"
    with open(path, "wb") as f:
        for _ in range(max(1, round(size / len(unit)))):
            f.write(unit)
    return path


# Runs argv[2:] and writes its ru_maxrss (KB) to argv[1]. A child's ru_maxrss counts the memory
# of the process it was spawned from (Linux keeps the high-water mark of the address space exec
# replaces, the parent's under vfork): spawned from this small interpreter, not from a large
# parent such as a test session, it measures the child alone.
SPAWN = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def child(cmd: list[str]) -> tuple[float, float, str]:
    """Run `cmd`; its wall seconds, peak resident MB (ru_maxrss) and stdout."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as rss:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", SPAWN, rss.name, *cmd], stdout=out,
                              stderr=subprocess.PIPE, env=env, cwd=PROJECT)
        seconds = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr.decode()[-2000:]}")
        out.seek(0)
        return seconds, int(rss.read()) * 1024 / 1e6, out.read().decode()


def run(
    quick: bool, large: bool = False, tokenizers: tuple[str, ...] = ("gpt2", "char"),
    rounds: int = 0, only: tuple[str, ...] = (), compact: tuple[bool, ...] = (True, False),
) -> Result:
    """`rounds` > 0 runs every size that many rounds (default: `rounds_for`); `only`: these
    sizes alone; `compact`: the gpt2 cases with these --compact."""
    sizes = ["5 MB"] if quick else ["5 MB", "100 MB"] + (["2 GB"] if large else [])
    sizes = [s for s in SIZES if s in only] if only else sizes
    result = Result(
        # results/corpus.json for the usual sizes, another file for others
        "corpus" + ("-" + "-".join(sizes).replace(" ", "") if only else ""),
        {"sizes": sizes, "source": "the Shakespeare plays, repeated", "cores": os.cpu_count(),
         "rounds": {label: rounds or rounds_for(label, quick) for label in sizes}},
        ["size", "tokenizer", "compact", "seconds", "MB/s", "peak RSS MB", "raw tiktoken MB/s",
         "vs raw"],
    )
    cases = [(t, c) for t, c in CASES
             if t in tokenizers and not (quick and t == "gpt2" and not c)
             and (t != "gpt2" or c in compact)]
    with tempfile.TemporaryDirectory() as tmp:
        for label in sizes:
            folder = Path(tmp) / label.replace(" ", "")
            folder.mkdir()
            path = source_text(SIZES[label], folder)
            nbytes = path.stat().st_size
            # Rounds of raw tiktoken then every case, and raw tiktoken once more at the end:
            # the machine's speed drifts over minutes, and each side sees the same drift.
            raws, raw_rss, rss, seconds = [], [], {}, {case: [] for case in cases}
            loads = result.settings.setdefault("load average before each run", {})[label] = []
            for _ in range(rounds or rounds_for(label, quick)):
                loads.append(round(os.getloadavg()[0], 2))
                mbps, peak = raw_tiktoken(path, label)
                raws.append(mbps)
                raw_rss.append(peak)
                for tokenizer, compact in cases:
                    loads.append(round(os.getloadavg()[0], 2))
                    run_dir = f"{tokenizer}-{compact}-{len(raws)}"
                    took, rss[tokenizer, compact], _ = child(
                        [sys.executable, "-m", "gpt", "load-corpus", "--root",
                         str(folder / "root"), "--run", run_dir, "--source", str(path),
                         "--tokenizer", tokenizer, "--compact", str(compact).lower(),
                         "--block_size", "64"]
                    )
                    seconds[tokenizer, compact].append(took)
                    print(f"bench: corpus {label} {tokenizer} compact={compact}: {took:.2f} s",
                          flush=True)
                    shutil.rmtree(folder / "root" / run_dir)
            loads.append(round(os.getloadavg()[0], 2))
            mbps, peak = raw_tiktoken(path, label)
            raws.append(mbps)
            raw_rss.append(peak)
            raw = Stats(raws).median
            for tokenizer, compact in cases:
                took = Stats(seconds[tokenizer, compact])
                mbps = nbytes / 1e6 / took.median
                result.rows.append({
                    "size": label, "bytes": nbytes, "tokenizer": tokenizer, "compact": compact,
                    "seconds": fmt_stats(took, " s"), "seconds_each": took.values,
                    "MB/s": round(mbps, 2), "peak RSS MB": round(rss[tokenizer, compact]),
                    "raw tiktoken MB/s": round(raw, 2),
                    "raw_mb_s_each": [round(r, 2) for r in raws],
                    "raw_peak_rss_mb": round(max(raw_rss)),
                    "vs raw": f"{mbps / raw:.2f}x",
                })
    return result


def rounds_for(label: str, quick: bool) -> int:
    """Runs of each case: the median of three where a run takes seconds, one at 2 GB."""
    return 1 if quick or label == "2 GB" else 3


def raw_tiktoken(path: Path, label: str) -> tuple[float, float]:
    """Raw tiktoken's MB/s on the file at `path`, and its peak resident MB."""
    _, rss, printed = child([sys.executable, "-c", RAW_SPLIT + RAW, str(path)])
    mbps = path.stat().st_size / 1e6 / float(printed)
    print(f"bench: corpus {label}: raw tiktoken {mbps:.2f} MB/s, {rss:.0f} MB", flush=True)
    return mbps, rss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus_speed", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 MB only")
    parser.add_argument("--large", action="store_true", help="add the 2 GB case (minutes)")
    parser.add_argument("--tokenizers", default="gpt2,char", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=0,
                        help="rounds at every size (default: 3, 1 at 2 GB and with --quick)")
    parser.add_argument("--sizes", default="",
                        help=f"only these, comma-separated: {', '.join(SIZES)}")
    parser.add_argument("--compact", default="true,false", help="the gpt2 cases' --compact")
    args = parser.parse_args(argv)
    only = tuple(filter(None, args.sizes.split(",")))
    compact = tuple(c == "true" for c in args.compact.split(","))
    result = run(args.quick, args.large, tuple(args.tokenizers.split(",")), args.rounds, only,
                 compact)  # fmt: skip
    result.settings["quick"] = args.quick
    print(result.markdown())
    print(f"bench: wrote {result.write()}")


if __name__ == "__main__":
    main()
