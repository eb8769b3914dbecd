"""Training speed side by side with nanoGPT: the peer trainer, unchanged, in the same run.

Both trainers run as the programs a user runs (`python train.py` from ../shared/peers/nanogpt,
`python -m gpt train-gpt`), one case after another on the same machine and the same token file
(written by `python -m gpt load-corpus`; nanoGPT reads its uint16 layout as is). This process
timestamps each step line as it arrives, so both are timed by one clock, in one way:

- **first step**: from process start to the first optimizer step's line (imports, data, model
  build, compilation, and for nanoGPT the evaluation it runs before step 0);
- **tokens/s**: tokens of the steps between the first line after the warm-up and the final
  line, over the time between the two lines. Both log every LOG_INTERVAL steps (nanoGPT's GPT-2
  config and our default), so a trainer that syncs with the GPU only to log gains by it;
- **MFU** (CUDA): tokens/s x training FLOPs per token of the shape (the same count for both,
  PaLM's 6N + 12LCT at the true vocabulary) / the GPU's dense bf16 peak;
- **peak memory**: the GPU memory nvidia-smi reports for the process (CUDA), or its peak
  resident memory (CPU, from wait4).

Shapes: on CUDA, GPT-2 124M (12 x 12 x 768, context 1024, 65,536 tokens per optimizer step,
GPT-2's 50,257-token BPE, bf16, torch.compile on both), nanoGPT at micro-batch 16 x 4 and 64 x 1,
this project with its default model (rope, relu2, spelled embedding) and with GPT-2's choices
(learned positions, GELU, a plain embedding table) at the same two splits. On CPU, nanoGPT's
"baby GPT" (4 x 4 x 128, context 64, batch 12, characters, fp32, no compile) for both. Both
without bias and dropout, as nanoGPT's defaults.

nanoGPT and the plays come from ../shared (or the folder GPT_SHARED names, e.g. a copy carried
to a GPU machine). Two settings for bench/gpu_session.sh, which has one short call for all it
measures: BENCH_SPLITS, the CUDA micro-batches to run (e.g. `64`: the three 64 x 1 cases; unset:
16 and 64), and BENCH_OURS_FLAGS, train-gpt flags every case of ours gets, as a JSON object (the
variants that won in bench/gpu_variants.py, e.g. `{"fused_loss": true}`).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import SHARED, Result, Stats, default_corpus, fmt_stats
from gpt.stages import to_args

REPO = Path(__file__).resolve().parents[1]
NANOGPT = SHARED / "peers" / "nanogpt"
PLAYS = SHARED / "data" / "shakespeare_plays.txt"
GPT2_CHOICES = {"position": "learned", "activation": "gelu", "spelling": 0}
# Step lines: nanoGPT's `iter N: loss L, time T ms, mfu M%`, ours `step N/M | loss L | ...`.
REPEATS = 5  # runs of each case on a CPU (medians and spreads in the table): one run varies by 10%
LOG_INTERVAL = 10  # both also log their first step: nanoGPT as iteration 0, we as step 1
STEP_LINE = {"nanogpt": re.compile(r"^iter (\d+): loss"), "ours": re.compile(r"^step +(\d+)/")}
DATASET = "bench"  # nanoGPT's name for our token files: data/bench/ in its working directory


@dataclass(frozen=True)
class Shape:
    """The model and batch both trainers train, and how the data is tokenized."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    tokens_per_step: int
    tokenizer: str
    device: str
    steps: int
    """Optimizer steps per case."""
    warmup: int
    """Steps left out of tokens/s (compilation, allocator and cache warm-up)."""

    def sequences(self) -> int:
        return self.tokens_per_step // self.block_size


@dataclass(frozen=True)
class Case:
    trainer: str  # "nanogpt" or "ours"
    label: str
    micro_batch: int
    flags: dict[str, Any] = field(default_factory=dict)


def shape_for(cuda: bool, quick: bool) -> Shape:
    if cuda:
        return Shape(12, 12, 768, 1024, 65536, "gpt2", "cuda", 30 if quick else 80, 10)
    return Shape(4, 4, 128, 64, 768, "char", "cpu", 40 if quick else 300, 10 if quick else 50)


def cases(shape: Shape, quick: bool) -> list[Case]:
    n = shape.sequences()
    if shape.device == "cpu":
        return [Case("nanogpt", "nanoGPT", n), Case("ours", "ours, GPT-2 choices", n, GPT2_CHOICES),
                Case("ours", "ours, default model", n)]
    splits = [16, 64] if not quick else [16]
    if os.environ.get("BENCH_SPLITS"):
        splits = [int(m) for m in os.environ["BENCH_SPLITS"].split(",")]
    found = [Case("nanogpt", f"nanoGPT {m} x {n // m}", m) for m in splits]
    for m in splits:
        found += [Case("ours", f"ours default {m} x {n // m}", m),
                  Case("ours", f"ours GPT-2 choices {m} x {n // m}", m, GPT2_CHOICES)]
    return found


def nanogpt_command(shape: Shape, case: Case) -> list[str]:
    cuda = shape.device == "cuda"
    flags = {
        "dataset": DATASET, "out_dir": "out", "device": shape.device,
        "compile": cuda, "dtype": "bfloat16" if cuda else "float32",
        "n_layer": shape.n_layer, "n_head": shape.n_head, "n_embd": shape.n_embd,
        "block_size": shape.block_size, "batch_size": case.micro_batch,
        "gradient_accumulation_steps": shape.sequences() // case.micro_batch,
        "max_iters": shape.steps - 1,  # it runs iterations 0 .. max_iters
        "lr_decay_iters": shape.steps, "warmup_iters": shape.steps // 4,
        "eval_interval": 10**9, "eval_iters": 1, "log_interval": LOG_INTERVAL,
        "always_save_checkpoint": False, "dropout": 0.0, "bias": False,
    }  # fmt: skip
    return nanogpt_argv(flags)


def nanogpt_argv(flags: dict[str, Any]) -> list[str]:
    """`python train.py --name=value ...`, nanoGPT's command line, run in its working directory
    (`nanogpt_workdir`)."""
    return [sys.executable, "train.py", *(f"--{k}={v}" for k, v in flags.items())]


def ours_flags() -> dict[str, Any]:
    """BENCH_OURS_FLAGS: the train-gpt flags every case of ours gets (none when unset)."""
    flags = json.loads(os.environ.get("BENCH_OURS_FLAGS") or "{}")
    if not isinstance(flags, dict):
        raise ValueError(f"BENCH_OURS_FLAGS {flags!r}: must be a JSON object of train-gpt flags")
    return flags


def ours_command(shape: Shape, case: Case, root: Path, run: str) -> list[str]:
    cuda = shape.device == "cuda"
    flags = {
        "root": root, "run": run, "device": shape.device, "compile": cuda,
        "n_layer": shape.n_layer, "n_head": shape.n_head, "n_embd": shape.n_embd,
        "block_size": shape.block_size, "batch_size": shape.sequences(),
        "grad_accum": shape.sequences() // case.micro_batch, "max_iters": shape.steps,
        "warmup_iters": shape.steps // 4, "time_budget": 0, "eval_interval": shape.steps,
        "eval_iters": 1, "ckpt_interval": shape.steps, "log_interval": LOG_INTERVAL,
        "dropout": 0.0,
        "bias": False, "resume": "never", **ours_flags(), **case.flags,
    }  # fmt: skip
    return [sys.executable, "-m", "gpt", "train-gpt", *to_args(flags)]


class GPUMemory(threading.Thread):
    """The most GPU memory nvidia-smi reports for one process while it runs (MiB)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_mib, self.done = pid, 0, threading.Event()
        self.tool = shutil.which("nvidia-smi")

    def run(self) -> None:
        query = [self.tool, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while self.tool and not self.done.wait(0.5):
            out = subprocess.run(query, capture_output=True, text=True).stdout
            for line in out.splitlines():
                pid, _, mib = line.partition(",")
                if pid.strip() == str(self.pid) and mib.strip().isdigit():
                    self.peak_mib = max(self.peak_mib, int(mib))


def timed_run(argv: list[str], cwd: Path, trainer: str, log: Path, cuda: bool,
              threads: int | None = None) -> dict[str, Any]:
    """Run one trainer (with `threads` CPU threads, else its own default); the arrival time of
    each step line, and its peak memory (on `cuda` the GPU's too)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    gpu = GPUMemory(proc.pid)
    if cuda:
        gpu.start()
    arrivals: list[tuple[int, float]] = []
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        for line in proc.stdout:
            out.write(line)
            if m := STEP_LINE[trainer].match(line):
                arrivals.append((int(m[1]), time.perf_counter() - start))
        _, status, usage = os.wait4(proc.pid, 0)
    gpu.done.set()
    if os.waitstatus_to_exitcode(status) != 0 or not arrivals:
        raise RuntimeError(f"{trainer} failed or logged no step; see {log}:\n"
                           f"{log.read_text()[-2000:]}")
    return {"arrivals": arrivals, "rss_mib": usage.ru_maxrss / 1024, "gpu_mib": gpu.peak_mib}


def rate_of(shape: Shape, trainer: str, arrivals: list[tuple[int, float]]) -> tuple[float, int]:
    """tokens/s of one run, timed from the end of the last warm-up step to the end of the last
    step, and how many steps that is."""
    # nanoGPT numbers its steps from 0, we from 1: both lines mean "this many steps done".
    done = [(n + 1 if trainer == "nanogpt" else n, t) for n, t in arrivals]
    warm = [i for i, (n, _) in enumerate(done) if n >= shape.warmup]
    (n0, t0), (n1, t1) = done[min(warm[0], len(done) - 2) if warm else 0], done[-1]
    return (n1 - n0) * shape.tokens_per_step / (t1 - t0), n1 - n0


def row_of(shape: Shape, case: Case, runs: list[dict[str, Any]], flops: float,
           peak: float | None) -> dict[str, Any]:
    """One case's row from its repeated runs: medians and spreads."""
    rates = [rate_of(shape, case.trainer, run["arrivals"]) for run in runs]
    rate = Stats([r for r, _ in rates])
    first = Stats([run["arrivals"][0][1] for run in runs])
    row = {
        "case": case.label, "trainer": case.trainer, "micro_batch": case.micro_batch,
        "tokens/s": fmt_stats(rate), "tokens_per_s": rate.as_dict(),
        "first step": fmt_stats(first, " s"), "first_step_s": first.as_dict(),
        "steps_timed": rates[0][1],
    }  # fmt: skip
    if shape.device == "cuda":
        mib = max(run["gpu_mib"] for run in runs)
        row["peak memory"] = f"{mib / 1024:.1f} GiB" if mib else "n/a"
        row["gpu_mib"] = mib
    else:
        mib = max(run["rss_mib"] for run in runs)
        row["peak memory"] = f"{mib:,.0f} MiB RSS"
        row["rss_mib"] = mib
    if peak:
        row["mfu"] = rate.median * flops / peak
        row["MFU"] = f"{row['mfu']:.1%}"
    return row


def prepare_data(shape: Shape, root: Path, quick: bool) -> tuple[str, int]:
    """`load-corpus` of the plays (a quick CPU run: the embedded text) into run `data` under
    `root`, the whole vocabulary kept; the run's name and its vocabulary size."""
    from gpt.rundir.layout import DataMeta

    source = "default" if quick and shape.device == "cpu" else str(PLAYS)
    rundir = default_corpus(root, "data", source=source, tokenizer=shape.tokenizer, compact=False,
                            block_size=shape.block_size)
    meta = DataMeta.read(rundir.meta_json)
    if meta.dtype != "uint16":
        raise RuntimeError(f"{rundir.meta_json}: nanoGPT reads uint16 token files only")
    return rundir.run_id, meta.vocab_size


def linked_run(root: Path, data_run: str, name: str) -> str:
    """A new run `name` under `root` that trains on `data_run`'s token files (linked, not copied,
    so every case reads the same file)."""
    (root / name).mkdir()
    for part in ("corpus", "data"):
        (root / name / part).symlink_to(root / data_run / part)
    return name


def require_nanogpt() -> None:
    if not (NANOGPT / "train.py").is_file():
        raise RuntimeError(f"{NANOGPT}: nanoGPT not found (set GPT_SHARED to a copy of shared/)")


def nanogpt_workdir(work: Path, data: Path, vocab_size: int | None) -> Path:
    """nanoGPT's working directory `work`: its three files, and the token files of our `data/`
    as its dataset DATASET, of `vocab_size` ids (None: GPT-2's, which nanoGPT pads to 50,304)."""
    dataset = work / "data" / DATASET
    dataset.mkdir(parents=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, work / name)
    for name in ("train.bin", "val.bin"):
        (dataset / name).symlink_to(data / name)
    if vocab_size is not None:  # without meta.pkl nanoGPT assumes GPT-2's padded 50,304
        # The peer's own format: written here, read only by the peer, never by this project.
        (dataset / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": vocab_size}))
    return work


def run(quick: bool) -> Result:
    import torch

    from gpt.config.configs import GPTConfig
    from gpt.models.model import GPT
    from gpt.training.metrics import PEAK_FLOPS

    require_nanogpt()
    cuda = torch.cuda.is_available()
    shape = shape_for(cuda, quick)
    name = torch.cuda.get_device_name() if cuda else ""
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None) if cuda else None
    result = Result(
        "vs_nanogpt",
        {"shape": {k: v for k, v in vars(shape).items()}, "nanogpt": str(NANOGPT),
         "device_name": name or "cpu", "peak_flops": peak,
         "threads": os.environ.get("OMP_NUM_THREADS", "one per core (each trainer's default)"),
         "ours_flags": ours_flags()},
        ["case", "tokens/s", "vs nanoGPT", "first step", "peak memory", *(["MFU"] if peak else [])],
    )
    with tempfile.TemporaryDirectory(prefix="vs-nanogpt-") as tmp:
        root = Path(tmp)
        data_run, vocab_size = prepare_data(shape, root, quick)
        model = GPT(GPTConfig(n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd,
                              block_size=shape.block_size, vocab_size=vocab_size, bias=False))
        flops = model.flops_per_token()
        del model
        work = nanogpt_workdir(root / "nanogpt", root / data_run / "data",
                               None if shape.tokenizer == "gpt2" else vocab_size)
        log = root / "runs.log"
        todo = cases(shape, quick)
        runs: list[list[dict[str, Any]]] = [[] for _ in todo]
        # Repeats interleaved (every case once, then again), so a slow spell of the machine
        # falls on all cases alike. A compiled 124M case costs a minute: once each on CUDA.
        for attempt in range(1 if cuda or quick else REPEATS):
            for i, case in enumerate(todo):
                print(f"vs_nanogpt: {case.label} ({attempt + 1}) ...", flush=True)
                if case.trainer == "nanogpt":
                    argv, cwd = nanogpt_command(shape, case), work
                else:
                    run_name = linked_run(root, data_run, f"ours-{i}-{attempt}")
                    argv, cwd = ours_command(shape, case, root, run_name), REPO
                runs[i].append(timed_run(argv, cwd, case.trainer, log, cuda))
        result.rows = [row_of(shape, c, r, flops, peak) for c, r in zip(todo, runs, strict=True)]
        best = max(r["tokens_per_s"]["median"] for r in result.rows if r["trainer"] == "nanogpt")
        for row in result.rows:
            row["ratio_to_best_nanogpt"] = row["tokens_per_s"]["median"] / best
            row["vs nanoGPT"] = f"{row['ratio_to_best_nanogpt']:.2f}x"
    return result
