"""Corpus files by format: load-corpus on the same text as plain `.txt`, as JSON Lines compressed
with zstd (`.jsonl.zst`) and as Parquet (and, with --formats, JSON Lines compressed with gzip,
bz2 or xz), its speed against the `.txt` and its peak memory; and the readers alone (no
tokenizing), JSON Lines parsed with orjson (load-corpus's) and with the standard json.

The text is the Shakespeare plays repeated, cut into FineWeb-like documents of ~4 KB at blank
lines; the `.txt` is those documents joined by a blank line, which is the text every format
gives (the stage's corpus_sha256 must agree: the table says so; the `.txt` is one document,
the records ~4 KB documents each encoded on its own, end-of-text between them). Parquet is
written in row groups of ROW_GROUP rows (~32 MB of text each: pyarrow decodes a row group's
column at once, so the stage's memory grows with the row group, not with the file). Each stage
runs as a child process (as in bench/corpus_speed.py: wall seconds, ru_maxrss, and here its CPU
seconds too, the steadier measure where other work shares the machine), in rounds (every format
once a round, each round starting with the next format), each format's median over the rounds
compared with the `.txt`'s. The load average is recorded before every run (other work on the
machine slows every format alike within a round).

`python -m bench.corpus_formats --size 250` (MB; the default); `--formats
txt,jsonl.gz,jsonl.bz2,jsonl.xz`; `make bench BENCH=corpus_formats`.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import functools
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.corpus_speed import PLAYS, PROJECT
from bench.harness import Result, Stats, fmt_stats

DOC_BYTES = 4000  # a document: the blank-line-cut pieces of the plays joined up to this size
ROW_GROUP = 8192  # Parquet rows per row group (~32 MB of these documents)
FORMATS = ("txt", "jsonl.zst", "parquet")  # the default; the .txt is always measured
# JSON Lines through each compressor: zstd at level 3, gzip and bz2 at their libraries' default
# levels (as such files are shipped), xz at preset 1 (its default, 6, writes 250 MB in over ten
# minutes here; reading, what is measured, runs at about the same speed at any preset)
JSONL = {"jsonl.zst": None, "jsonl.gz": gzip.open, "jsonl.bz2": bz2.open,
         "jsonl.xz": functools.partial(lzma.open, preset=1)}

# The readers alone: read_source into a sink that counts; argv: source, json library.
READER = """
import sys, tempfile, time
from pathlib import Path
from gpt.data import records
from gpt.data.sources import Download, read_source
if sys.argv[2] == "json":
    import json
    records.loads = json.loads
n = [0]
def sink(data): n[0] += len(data)
t0, c0 = time.perf_counter(), time.process_time()
with tempfile.TemporaryDirectory() as scratch:
    read_source(sys.argv[1], Download(max_bytes=10**11), Path(scratch), sink)
print(time.perf_counter() - t0, time.process_time() - c0, n[0])
"""


def documents(size: int) -> Iterator[str]:
    """~`size` bytes of the plays (or the embedded corpus), repeated, as ~DOC_BYTES documents."""
    from gpt.data.sources import EMBEDDED_ASSET

    if PLAYS.exists():
        unit = PLAYS.read_text()
    else:
        from importlib import resources

        unit = (resources.files("gpt.assets") / EMBEDDED_ASSET).read_text()
    pieces = [p for p in unit.split("\n\n") if p.strip()]
    made, doc = 0, []
    while made < size:
        for piece in pieces:
            doc.append(piece)
            if sum(map(len, doc)) >= DOC_BYTES:
                text = "\n\n".join(doc)
                made += len(text.encode()) + 2
                doc = []
                yield text
                if made >= size:
                    return


def write_sources(size: int, folder: Path, formats: tuple[str, ...]) -> dict[str, Path]:
    """The same documents as .txt and each of `formats`, streamed to disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    paths = {fmt: folder / f"corpus.{fmt}" for fmt in formats}
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    with contextlib.ExitStack() as files:
        txt = files.enter_context(open(paths["txt"], "wb"))
        jsonls = []
        for fmt in set(formats) & JSONL.keys():
            if JSONL[fmt] is None:
                raw = files.enter_context(open(paths[fmt], "wb"))
                writer = zstandard.ZstdCompressor(level=3).stream_writer(raw)
            else:
                writer = JSONL[fmt](paths[fmt], "wb")
            jsonls.append(files.enter_context(writer))
        parquet = (files.enter_context(pq.ParquetWriter(paths["parquet"], schema))
                   if "parquet" in formats else None)  # fmt: skip
        batch: list[str] = []
        for i, doc in enumerate(documents(size)):
            txt.write((b"\n\n" if i else b"") + doc.encode())
            line = json.dumps({"id": i, "text": doc}).encode() + b"\n"
            for jsonl in jsonls:
                jsonl.write(line)
            batch.append(doc)
            if parquet and len(batch) == ROW_GROUP:
                parquet.write_table(pa.table({"id": range(i - len(batch) + 1, i + 1),
                                              "text": batch}, schema=schema))  # fmt: skip
                batch = []
            elif not parquet:
                batch = []
        if parquet and batch:
            start = i - len(batch) + 1
            parquet.write_table(pa.table({"id": range(start, i + 1), "text": batch},
                                         schema=schema))  # fmt: skip
    return paths


# Runs argv[2:] and writes its ru_maxrss (KB) and CPU seconds (user + system) to argv[1]
# (bench/corpus_speed.py's SPAWN, with the CPU time: on a shared machine whose load changes by
# the minute, a child's CPU seconds vary far less than its wall time).
SPAWN = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def child(cmd: list[str]) -> tuple[float, float, float, str]:
    """Run `cmd`: its wall seconds, CPU seconds, peak resident MB and stdout."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as usage:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", SPAWN, usage.name, *cmd], stdout=out,
                              stderr=subprocess.PIPE, env=env, cwd=PROJECT)  # fmt: skip
        seconds = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr.decode()[-2000:]}")
        out.seek(0)
        rss, cpu = usage.read().split()
        return seconds, float(cpu), int(rss) * 1024 / 1e6, out.read().decode()


def stage(path: Path, root: Path, run: str) -> tuple[float, float, float, str]:
    """load-corpus on `path` (the defaults: gpt2 compacted): wall and CPU seconds, peak MB, the
    corpus's sha256."""
    took, cpu, rss, _ = child([sys.executable, "-m", "gpt", "load-corpus", "--root", str(root),
                               "--run", run, "--source", str(path), "--block_size", "64"])
    sha = json.loads((root / run / "data" / "meta.json").read_text())["corpus_sha256"]
    shutil.rmtree(root / run)
    return took, cpu, rss, sha


def reader(path: Path, library: str) -> tuple[float, float, float]:
    """The reader alone: MB/s of text it gives (wall, CPU), and its peak MB."""
    _, cpu, rss, printed = child([sys.executable, "-c", READER, str(path), library])
    seconds, cpu_in, nbytes = printed.split()
    mb = int(nbytes) / 1e6
    return mb / float(seconds), mb / float(cpu_in), rss


def run(quick: bool, size_mb: int = 250, rounds: int = 2,
        formats: tuple[str, ...] = FORMATS) -> Result:
    size = (20 if quick else size_mb) * 1_000_000
    rounds = 1 if quick else rounds
    formats = ("txt", *(f for f in formats if f != "txt"))
    loads: list[float] = []
    result = Result(
        # results/corpus_formats.json for the default formats, another file for others
        "corpus_formats" + ("" if formats == FORMATS else "-" + "-".join(formats[1:])),
        {"text MB": size // 1_000_000, "rounds": rounds, "document bytes": DOC_BYTES,
         "parquet row group rows": ROW_GROUP, "cores": os.cpu_count(), "formats": formats,
         "load average before each run": loads,
         "stage": "load-corpus --tokenizer gpt2 --compact true (the defaults)"},
        ["format", "file MB", "stage seconds", "stage MB/s", "vs .txt", "stage CPU s",
         "vs .txt (CPU)", "stage peak RSS MB", "same text", "reader MB/s", "reader MB/s (CPU)",
         "reader peak RSS MB"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_sources(size, folder, formats)
        text_mb = paths["txt"].stat().st_size / 1e6
        seconds: dict[str, list[float]] = {fmt: [] for fmt in formats}
        cpus: dict[str, list[float]] = {fmt: [] for fmt in formats}
        rss: dict[str, float] = {}
        sha: dict[str, str] = {}
        for r in range(rounds):
            # each round starts one format later: the machine's drift within a round (tens of
            # percent in minutes here) falls on every format alike over the rounds
            for fmt in formats[r % len(formats):] + formats[: r % len(formats)]:
                loads.append(round(os.getloadavg()[0], 2))
                took, cpu, rss[fmt], sha[fmt] = stage(paths[fmt], folder / "root", f"{fmt}-{r}")
                seconds[fmt].append(took)
                cpus[fmt].append(cpu)
                print(f"bench: corpus_formats {fmt} round {r + 1}: {took:.1f} s, CPU {cpu:.1f} s, "
                      f"{rss[fmt]:.0f} MB (load average {loads[-1]})", flush=True)
        txt, txt_cpu = Stats(seconds["txt"]).median, Stats(cpus["txt"]).median
        readers = {fmt: reader(paths[fmt], "orjson") for fmt in formats}
        if "jsonl.zst" in formats:  # the parser load-corpus does not use, beside its own
            readers["jsonl.zst (json)"] = reader(paths["jsonl.zst"], "json")
        for fmt in readers:
            mbps, cpu_mbps, peak = readers[fmt]
            row = {"format": fmt, "reader MB/s": round(mbps, 1),
                   "reader MB/s (CPU)": round(cpu_mbps, 1), "reader peak RSS MB": round(peak)}
            if fmt in formats:
                took, cpu = Stats(seconds[fmt]), Stats(cpus[fmt])
                row.update({
                    "file MB": round(paths[fmt].stat().st_size / 1e6, 1),
                    "stage seconds": fmt_stats(took, " s"), "seconds_each": took.values,
                    "stage MB/s": round(text_mb / took.median, 2),
                    "vs .txt": f"{txt / took.median:.2f}x",
                    "stage CPU s": fmt_stats(cpu, " s"), "cpu_seconds_each": cpu.values,
                    "vs .txt (CPU)": f"{txt_cpu / cpu.median:.2f}x",
                    "stage peak RSS MB": round(rss[fmt]),
                    "same text": "yes" if sha[fmt] == sha["txt"] else "NO",
                })
            result.rows.append(row)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus_formats", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20 MB, one round")
    parser.add_argument("--size", type=int, default=250, help="MB of text (default 250)")
    parser.add_argument("--rounds", type=int, default=2, help="stage runs per format")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated, of txt, parquet, {', '.join(JSONL)}")
    args = parser.parse_args(argv)
    result = run(args.quick, args.size, args.rounds, tuple(args.formats.split(",")))
    result.settings["quick"] = args.quick
    print(result.markdown())
    print(f"bench: wrote {result.write()}")


if __name__ == "__main__":
    main()
