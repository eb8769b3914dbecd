"""What a person reads about a training run: `metrics/train.jsonl`, `loss.png`, `report.md`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure

from gpt import atomic

if TYPE_CHECKING:
    from gpt.data import DataMeta
    from gpt.model import GPT
    from gpt.rundir import RunDir
    from gpt.train import TrainConfig
    from gpt.trainer import TrainState


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keep_until(path: Path, step: int) -> None:
    """Drop the records after `step`: a resumed run logs those steps again."""
    records = read_jsonl(path)
    kept = [r for r in records if r["step"] <= step]
    if len(kept) < len(records):
        atomic.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def plot_losses(records: list[dict[str, Any]], dest: Path) -> None:
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
    with atomic.atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png", dpi=100)


def write(run: RunDir, cfg: TrainConfig, model: GPT, meta: DataMeta, state: TrainState,
          val: dict[str, float], stopped_by: str, world_size: int, device: str) -> None:
    """loss.png and report.md from the whole run's train.jsonl."""
    records = read_jsonl(run.train_jsonl)
    plot_losses(records, run.loss_png)
    mc = model.config
    train_losses = [r["loss"] for r in records if "loss" in r]
    rows = [
        ("model", f"{mc.n_layer} layers x {mc.n_head} heads x {mc.n_embd} wide, context "
                  f"{mc.block_size}, {model.num_params() / 1e6:.2f}M parameters"),
        ("data", f"{meta.tokenizer} tokenizer, vocab {meta.vocab_size}, {meta.train_tokens:,} "
                 f"train / {meta.val_tokens:,} validation tokens"),
        ("training", f"{state.step} steps of {cfg.batch_size} x {cfg.block_size} tokens, "
                     f"{state.tokens:,} tokens in {state.elapsed_s:.0f} s "
                     f"({state.tokens / max(state.elapsed_s, 1e-9):,.0f} tokens/s), "
                     f"{world_size} process(es) on {device}; stopped by {stopped_by}"),
        ("last train loss", f"{train_losses[-1]:.4f} nats/token" if train_losses else "-"),
        ("validation loss", f"{val['val_loss']:.4f} nats/token = "
                            f"**{val['val_bpb']:.3f} bits per byte**"),
    ]
    flags = " ".join(f"--{k} {v}" for k, v in vars(cfg).items() if k not in ("root", "run"))
    text = (
        f"# train-gpt: run `{run.run}`\n\n| | |\n| --- | --- |\n"
        + "".join(f"| {k} | {v} |\n" for k, v in rows)
        + "\n![train and validation loss](loss.png)\n\n"
        + f"## Settings\n\n```\npython -m gpt train {flags}\n```\n"
    )
    atomic.write_text(run.report_md, text)
