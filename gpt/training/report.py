"""What a person reads about a training run: `metrics/train.jsonl`, `loss.png`, `report.md`."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt.config.configs import TrainConfig
from gpt.rundir import atomic
from gpt.rundir.layout import RunDir
from gpt.stages import TRAIN_GPT, to_args
from gpt.training.checkpoint_files import TrainState


@dataclass(frozen=True)
class Summary:
    """What report.md says of a finished run besides its metrics, in the trainer's words."""

    model: str
    """The model in one line (`GPT.describe`)."""
    data: str
    """The data in one line (`DataMeta.describe`)."""
    training: str
    """Iterations, tokens, time, processes, and what stopped it."""
    val_loss: float
    val_bpb: float
    command: str
    """The command line that repeats the run."""
    started_from: str = ""
    """What the model was fine-tuned from (--init_from: source, revision, weights' sha256);
    "" for a model trained from scratch."""


def stopped_by(cfg: TrainConfig, st: TrainState) -> str:
    """What ended a finished run: the flag whose limit it reached."""
    return "max_iters" if st.step >= cfg.max_iters else "time_budget"


def summary(cfg: TrainConfig, st: TrainState, val: dict[str, float], model: str, data: str,
            where: str, started_from: str = "") -> Summary:
    """The summary of a run with flags `cfg` that ended at `st` with validation losses `val`,
    of `model` on `data`, trained on `where` (the processes and device)."""
    flags = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("root", "run")}
    return Summary(
        model=model,
        data=data,
        training=(
            f"{st.step} steps of {cfg.batch_size} x {cfg.block_size} tokens, "
            f"{st.tokens:,} tokens in {st.elapsed_s:.0f} s "
            f"({st.tokens / max(st.elapsed_s, 1e-9):,.0f} tokens/s), "
            f"{where}; stopped by {stopped_by(cfg, st)}"
        ),
        val_loss=val["val_loss"],
        val_bpb=val["val_bpb"],
        command=shlex.join(TRAIN_GPT.command(to_args(flags))),
        started_from=started_from,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keep_until(path: Path, iteration: int) -> None:
    """Drop the records after `iteration`: a resumed run logs those iterations again."""
    records = read_jsonl(path)
    kept = [r for r in records if r["step"] <= iteration]
    if len(kept) < len(records):
        atomic.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept),
                          what=f"the metrics up to step {iteration}")


def plot_losses(records: list[dict[str, Any]], dest: Path) -> None:
    # Imported here, at the end of training: at the top it would cost every start ~0.3 s.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="tight")
    ax = fig.add_subplot()
    for key, label, style in (("loss", "train", "-"), ("val_loss", "validation", "o-")):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    with atomic.atomic_path(dest, what="the loss plot") as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def write(rundir: RunDir, summary: Summary) -> None:
    """loss.png and report.md from the whole run's train.jsonl."""
    records = read_jsonl(rundir.train_jsonl)
    plot_losses(records, rundir.loss_png)
    train_losses = [r["loss"] for r in records if "loss" in r]
    rows = [
        ("model", summary.model),
        *([("fine-tuned from", summary.started_from)] if summary.started_from else []),
        ("data", summary.data),
        ("training", summary.training),
        ("last train loss", f"{train_losses[-1]:.4f} nats/token" if train_losses else "-"),
        ("validation loss", f"{summary.val_loss:.4f} nats/token = "
                            f"**{summary.val_bpb:.3f} bits per byte**"),
    ]
    text = (
        f"# train-gpt: run `{rundir.run_id}`\n\n| | |\n| --- | --- |\n"
        + "".join(f"| {k} | {v} |\n" for k, v in rows)
        + "\n![train and validation loss](loss.png)\n\n"
        + f"## Settings\n\n```\n{summary.command}\n```\n"
    )
    atomic.write_text(rundir.report_md, text, what="the report")
