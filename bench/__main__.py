"""`python -m bench [--quick] [names...]`: run benchmarks, print a summary table, write results.

Each benchmark module has `run(quick) -> Result`; results land in `bench/results/<name>.json`
and the summary in `bench/results/summary.md`. Benchmarks report; they never fail on a number.
One whose `run` also takes `results` (the folder) writes its rows there as it goes, so a run cut
short keeps them (bench/gpu_variants.py, whose last variant may outlast its call).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import time
from pathlib import Path

from bench.harness import RESULTS, summary

BENCHMARKS = {
    "corpus": "bench.corpus_speed",
    "corpus_formats": "bench.corpus_formats",
    "objectstore": "bench.objectstore_speed",
    "train": "bench.train_speed",
    "generation": "bench.generation_speed",
    "launcher": "bench.launcher_latency",
    "time_to_quality": "bench.time_to_quality",
    "vs_nanogpt": "bench.vs_nanogpt",
    "precision": "bench.precision",
    "gpu_variants": "bench.gpu_variants",
    "step_memory": "bench.step_memory",
    "stop_checkpoint": "bench.stop_checkpoint",
    "finetune": "bench.finetune",
    "status_server": "bench.status_server",
    "activation_memory": "bench.activation_memory",
    "memory_peaks": "bench.memory_peaks",
    "finetune_memory": "bench.finetune_memory",
    "chat_loss": "bench.chat_loss",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and cases (< 1 min)")
    known = ", ".join(BENCHMARKS)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run: {known} (default: all)")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="DIR",
                        help=f"where the JSON files and summary.md go (default: {RESULTS})")
    args = parser.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {known}")
    for name in names:
        print(f"bench: {name} ...", flush=True)
        t0 = time.perf_counter()
        run = importlib.import_module(BENCHMARKS[name]).run
        as_it_goes = "results" in inspect.signature(run).parameters
        result = run(args.quick, results=args.results) if as_it_goes else run(args.quick)
        result.settings["quick"] = args.quick
        path = result.write(args.results)
        table = result.markdown()
        print(table)
        print(f"bench: {name} done in {time.perf_counter() - t0:.0f} s, wrote {path}", flush=True)
    (args.results / "summary.md").write_text(summary(args.results))
    print(f"bench: summary in {args.results / 'summary.md'}")


if __name__ == "__main__":
    main()
