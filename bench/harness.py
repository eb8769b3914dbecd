"""What every benchmark shares: warm up, repeat, summarise, record the machine, write results.

A result file `bench/results/<name>.json` holds the machine, the settings and one row per case
with the median and the spread of the repeats, so a number can be re-checked later.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpt.rundir.layout import RunDir

RESULTS = Path(__file__).resolve().parent / "results"
# ../shared beside the project: the larger corpora, the peers and the test API server; or a copy
# of it that GPT_SHARED names (on a GPU machine, which gets the checkout alone).
SHARED = Path(os.environ.get("GPT_SHARED") or Path(__file__).resolve().parents[2] / "shared")


def machine() -> dict[str, Any]:
    """CPU model, cores, torch version and threads, and the GPU if there is one."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        # Benchmarks share the machine with whatever else runs: a load above the core count
        # means the numbers are low.
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


@dataclass
class Stats:
    """Median and spread of repeated measurements of one quantity."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """Half the range, relative to the median: 0.05 means +-5%."""
        if len(self.values) < 2 or self.median == 0:
            return 0.0
        return (max(self.values) - min(self.values)) / 2 / abs(self.median)

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "spread": self.spread, "values": self.values}


def repeat(fn: Callable[[], float], warmup: int, repeats: int) -> Stats:
    """Run `fn` `warmup` times unrecorded, then `repeats` times; `fn` returns the quantity."""
    for _ in range(warmup):
        fn()
    return Stats([fn() for _ in range(repeats)])


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of `fn` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[int]:
    """Run the block with `n` CPU threads (None: leave the count as it is); yields the count."""
    import torch

    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)


def default_corpus(root: str | Path, run: str = "bench", **flags: Any) -> RunDir:
    """`python -m gpt load-corpus` into run `run` under `root`, quietly: with no `flags` every
    default (the embedded corpus, the compacted GPT-2 tokenizer), what the default model trains
    on; `flags` are the stage's own (source, tokenizer, ...)."""
    from gpt.config.configs import CorpusConfig
    from gpt.load_corpus import main as corpus_main

    cfg = CorpusConfig(root=str(root), run=run, **flags)
    with contextlib.redirect_stdout(io.StringIO()):
        corpus_main(cfg)
    return cfg.rundir


@dataclass
class Result:
    """One benchmark's output: settings, rows of cases, and the table columns to show."""

    name: str
    settings: dict[str, Any]
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def write(self, folder: Path = RESULTS) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        doc = {
            "name": self.name,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(),
            "settings": self.settings,
            "columns": self.columns,
            "rows": self.rows,
        }
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def markdown(self, measured: str = "") -> str:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(cells) + " |"

        body = [line([_fmt(row.get(c, "")) for c in self.columns]) for row in self.rows]
        rule = "|" + "---|" * len(self.columns)
        head = [f"### {self.name}", "", *([measured, ""] if measured else [])]
        return "\n".join([*head, line(self.columns), rule, *body, ""])


def summary(folder: Path = RESULTS) -> str:
    """Every result in `folder` as Markdown, each table with when and where it was measured, so
    running one benchmark refreshes its table and keeps the others'."""
    parts = ["# Benchmark results", ""]
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        m = doc["machine"]
        load = m.get("load_avg")
        measured = (
            f"{'Quick' if doc['settings'].get('quick') else 'Full'} run, {doc['when'][:16]}: "
            f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
            f"GPU {m['gpu'] or 'none'}" + (f", load average {load[0]:g}" if load else "") + "."
        )
        result = Result(doc["name"], doc["settings"], doc["columns"], doc["rows"])
        parts.append(result.markdown(measured))
    return "\n".join(parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def fmt_stats(s: Stats, unit: str = "") -> str:
    """`1,234 tok/s ±3%` for a table cell."""
    return f"{_fmt(s.median)}{unit} ±{s.spread * 100:.0f}%"


def own_process(module: str, *args: str, limit_s: float | None = None) -> dict[str, Any]:
    """`python -m module args...` in a process of its own (a case whose memory or failure must
    be its own), whose last output line is a JSON object, its result; a failure or the limit is
    `{"error": ...}`, the failure's last line."""
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                              text=True, timeout=limit_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"stopped at its limit of {limit_s:g} s"}
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        return {"error": lines[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def case_main(measure: Callable[..., dict[str, Any]], what: str, **choices: Any) -> None:
    """The command line of one case of a benchmark whose cases run by `own_process`: each
    argument one of its `choices`, then `measure`'s result printed as JSON."""
    parser = argparse.ArgumentParser(description=f"one case of {what}")
    for name, allowed in choices.items():
        parser.add_argument(name, choices=allowed)
    args = parser.parse_args()
    print(json.dumps(measure(*(getattr(args, name) for name in choices))))
