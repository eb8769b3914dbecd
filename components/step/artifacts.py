"""KFP artifacts from a stage's run-directory files (whichever backend brought them back).

Pure functions of bytes, so they are the same for a TrainJob's log and a local directory. From a
TrainJob, train.jsonl arrives thinned to at most components/trainjob/stagelog.py's CARRY_MAX_RECORDS
records, every evaluation and the last record kept: the final values below are exact, the median
tokens/s is the carried records'. The whole file stays in the run directory.
"""

from __future__ import annotations

import base64
import html
import json
import posixpath
import re
import statistics
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

from gpt.rundir.layout import RunDir

# The files a stage brings back, keyed by their path inside the run directory.
META_JSON = RunDir.meta_json.rel
TRAIN_JSONL = RunDir.train_jsonl.rel
REPORT_MD = RunDir.report_md.rel
LOSS_PNG = RunDir.loss_png.rel
TRANSCRIPT_JSONL = RunDir.transcript_jsonl.rel
INIT_FROM_JSON = RunDir.init_from_json.rel


def _jsonl(data: bytes | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data or b"").decode().splitlines() if line.strip()]


def corpus_metrics(files: dict[str, bytes]) -> dict[str, float]:
    """The numbers of meta.json (gpt/rundir/layout.py's DataMeta): vocabulary, tokens and bytes of
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


def train_provenance(files: dict[str, bytes]) -> dict[str, str]:
    """What a fine-tuned run started from (metrics/init_from.json: the source, its Hub revision,
    the weights' sha256), as the Metrics artifact's metadata beside the numbers; {} for a run
    trained from scratch. KFP's scalar-metrics view shows numbers only; these show in the
    artifact's details and in ML Metadata, where a lineage query reads them."""
    if INIT_FROM_JSON not in files:
        return {}
    record = json.loads(files[INIT_FROM_JSON])
    keys = {"init_from": "init_from", "revision": "init_from_revision",
            "weights_sha256": "init_from_weights_sha256"}  # fmt: skip
    return {ours: str(record[theirs]) for theirs, ours in keys.items() if record.get(theirs)}


# How the metrics table shows each number: as people read them, not as `1.235e+04`.
_METRIC_FORMATS = {
    "train_loss": "{:.4f} nats/token",
    "val_loss": "{:.4f} nats/token",
    "val_bits_per_byte": "{:.3f} bits/byte",
    "tokens_per_s": "{:,.0f} tokens/s",
    "steps": "{:,.0f}",
}
_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                ".gif": "image/gif", ".svg": "image/svg+xml"}  # fmt: skip


def _inline_images(tokens: list[Token], files: dict[str, bytes], base: str) -> None:
    """Point every image of the parsed Markdown at its carried file as a data: URL, so the page
    stands alone in KFP's viewer; an image whose file did not come back says so in words."""
    for token in tokens:
        for child in token.children or []:
            if child.type != "image":
                continue
            src = posixpath.normpath(posixpath.join(base, str(child.attrGet("src"))))
            kind = _IMAGE_TYPES.get(posixpath.splitext(src)[1].lower())
            if src in files and kind:
                data = base64.b64encode(files[src]).decode()
                child.attrSet("src", f"data:{kind};base64,{data}")
            else:
                child.type, child.tag, child.children = "text", "", None
                child.content = f"({child.content or 'image'}: {src} was not carried back)"


def markdown_html(text: str, files: dict[str, bytes], base: str) -> str:
    """`text` (Markdown at `base` in the run directory) as HTML, by markdown-it-py with tables
    and no raw HTML: a run's command line or a prompt is shown, never executed as markup."""
    md = MarkdownIt("js-default")
    tokens = md.parse(text)
    _inline_images(tokens, files, base)
    return md.renderer.render(tokens, md.options, {})


def train_report_html(run_id: str, files: dict[str, bytes]) -> str:
    """One self-contained page: the stage's report.md rendered, its loss curve inlined, then the
    final metrics as KFP records them."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_METRIC_FORMATS[k].format(v))}</td></tr>"
        for k, v in train_metrics(files).items()
    )
    if REPORT_MD in files:
        report = markdown_html(files[REPORT_MD].decode(), files, posixpath.dirname(REPORT_MD))
    else:
        report = (f"<h1>train-gpt: run {html.escape(run_id)}</h1>"
                  f"<p>(no {REPORT_MD}: the train stage did not carry it back)</p>")  # fmt: skip
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>train-gpt</title>"
        "<style>body{font-family:sans-serif;margin:1em;max-width:60em}"
        "th,td{text-align:left;padding:0.2em 1em 0.2em 0}td{font-variant-numeric:tabular-nums}"
        "pre{background:#f4f4f4;padding:1em;white-space:pre-wrap}img{max-width:100%}</style>"
        f"</head><body>{report}<h2>Final metrics</h2><table>{rows}</table></body></html>"
    )


def code_fence(text: str) -> str:
    """A code fence longer than any run of backticks inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def transcript_markdown(run_id: str, files: dict[str, bytes]) -> str:
    """The conversation as Markdown: each prompt quoted, each reply verbatim in a code block; a
    chat model's replies under a heading per conversation, its system prompt first."""
    turns = _jsonl(files.get(TRANSCRIPT_JSONL))
    parts = [f"# generative-prompt: run `{run_id}`\n"]
    if not turns:
        parts.append("\n_No prompts were answered._\n")
    conversation = None
    for i, turn in enumerate(turns, 1):
        if "conversation" in turn and turn["conversation"] != conversation:
            conversation = turn["conversation"]
            parts.append(f"\n## Conversation `{conversation}`\n")
            first = (turn.get("messages") or [{}])[0]
            if first.get("role") == "system" and first.get("content"):
                parts.append(f"\n_System prompt:_ {first['content']}\n")
        prompt, reply = turn.get("prompt", ""), turn.get("reply", "")
        quoted = "\n".join("> " + line for line in prompt.splitlines() or [""])
        fence = code_fence(reply)
        level = "###" if conversation is not None else "##"
        parts.append(f"\n{level} {i}\n\n{quoted}\n\n{fence}text\n{reply}\n{fence}\n")
    return "".join(parts)
