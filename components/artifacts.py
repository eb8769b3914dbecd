"""KFP artifacts from a stage's run-directory files (whichever backend brought them back).

Pure functions of bytes, so they are the same for a TrainJob's log and a local directory. From a
TrainJob, train.jsonl arrives thinned to at most components/stagelog.py's CARRY_MAX_RECORDS
records, every evaluation and the last record kept: the final values below are exact, the median
tokens/s is the carried records'. The whole file stays in the run directory.
"""

from __future__ import annotations

import base64
import html
import json
import re
import statistics
from typing import Any

from gpt.rundir import RunDir

# The files a stage brings back, keyed by their path inside the run directory.
META_JSON = RunDir.meta_json.rel
TRAIN_JSONL = RunDir.train_jsonl.rel
REPORT_MD = RunDir.report_md.rel
LOSS_PNG = RunDir.loss_png.rel
TRANSCRIPT_JSONL = RunDir.transcript_jsonl.rel


def _jsonl(data: bytes | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data or b"").decode().splitlines() if line.strip()]


def corpus_metrics(files: dict[str, bytes]) -> dict[str, float]:
    """The numbers of meta.json (gpt/rundir.py's DataMeta): vocabulary, tokens and bytes of
    each split."""
    if META_JSON not in files:
        raise ValueError(f"{META_JSON}: missing; the corpus stage wrote no data")
    meta = json.loads(files[META_JSON])
    keys = ("vocab_size", "train_tokens", "val_tokens", "train_bytes", "val_bytes")
    return {k: float(meta[k]) for k in keys if isinstance(meta.get(k), int | float)}


def train_metrics(files: dict[str, bytes]) -> dict[str, float]:
    """Final train/validation loss, validation bits per byte and the median training tokens/s."""
    records = _jsonl(files.get(TRAIN_JSONL))
    if not records:
        raise ValueError(f"{TRAIN_JSONL}: missing or empty; the train stage logged nothing")

    def last(key: str) -> float | None:
        return next((r[key] for r in reversed(records) if r.get(key) is not None), None)

    speeds = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    found = {
        "train_loss": last("loss"),
        "val_loss": last("val_loss"),
        "val_bits_per_byte": last("val_bpb"),
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "steps": last("step"),
    }
    return {k: float(v) for k, v in found.items() if v is not None}


def train_report_html(run: str, files: dict[str, bytes]) -> str:
    """One self-contained page: the metrics, the loss curve inlined, the stage's report.md."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{v:.4g}</td></tr>"
        for k, v in train_metrics(files).items()
    )
    png = files.get(LOSS_PNG)
    curve = (
        f'<img alt="train and validation loss" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode()}">'
        if png
        else f"<p>(no loss curve: {LOSS_PNG} was not written)</p>"
    )
    report = files.get(REPORT_MD, f"(no {REPORT_MD})".encode()).decode()
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>train-gpt</title>"
        "<style>body{font-family:sans-serif;margin:1em}th{text-align:left;padding-right:1em}"
        "pre{background:#f4f4f4;padding:1em;white-space:pre-wrap}</style></head><body>"
        f"<h1>train-gpt: run {html.escape(run)}</h1><table>{rows}</table>{curve}"
        f"<h2>report.md</h2><pre>{html.escape(report)}</pre></body></html>"
    )


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def transcript_markdown(run: str, files: dict[str, bytes]) -> str:
    """The conversation as Markdown: each prompt quoted, each reply verbatim in a code block."""
    turns = _jsonl(files.get(TRANSCRIPT_JSONL))
    parts = [f"# generative-prompt: run `{run}`\n"]
    if not turns:
        parts.append("\n_No prompts were answered._\n")
    for i, turn in enumerate(turns, 1):
        prompt, reply = turn.get("prompt", ""), turn.get("reply", "")
        quoted = "\n".join("> " + line for line in prompt.splitlines() or [""])
        fence = _fence(reply)
        parts.append(f"\n## {i}\n\n{quoted}\n\n{fence}text\n{reply}\n{fence}\n")
    return "".join(parts)
