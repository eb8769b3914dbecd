"""The KFP artifacts of a train-gpt run (components/step/artifacts.py): the HTML report KFP's viewer
shows is report.md rendered, with its curve, and numbers as people read them."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from components.step.artifacts import (
    INIT_FROM_JSON,
    LOSS_PNG,
    REPORT_MD,
    TRAIN_JSONL,
    TRANSCRIPT_JSONL,
    train_provenance,
    train_report_html,
    transcript_markdown,
)
from gpt.rundir.layout import RunDir
from gpt.training import report


class _Page(HTMLParser):
    """The tags of a page, and the text of its table cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _run_files(tmp_path, command: str) -> dict[str, bytes]:
    """The files a real train-gpt run carries back, written by gpt/training/report.py."""
    run = RunDir.of(tmp_path, "r")
    run.train_jsonl.parent.mkdir(parents=True)
    records = [{"step": s, "loss": 5.0 - s / 100, "tokens_per_s": 12345.4} for s in range(1, 101)]
    records[-1] |= {"val_loss": 4.1234, "val_bpb": 1.8876}
    run.train_jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    report.write(run, report.Summary(model="GPT 0.2M", data="12,000 tokens", training="100 steps",
                                     val_loss=4.1234, val_bpb=1.8876, command=command))  # fmt: skip
    return {rel: (tmp_path / "r" / rel).read_bytes() for rel in (TRAIN_JSONL, REPORT_MD, LOSS_PNG)}


def _page(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_the_report_is_rendered_markdown_with_its_curve_inlined(tmp_path) -> None:
    files = _run_files(tmp_path, "python -m gpt train-gpt --run '<script>alert(1)</script>'")
    html = train_report_html("r", files)
    page = _page(html)
    tags = [tag for tag, _ in page.tags]
    assert tags.count("h1") == 1 and "h2" in tags  # report.md's headings
    assert tags.count("table") == 2  # report.md's own table, and the final metrics
    assert "| --- |" not in html and "![" not in html  # no Markdown source left
    (img,) = [attrs for tag, attrs in page.tags if tag == "img"]
    assert img["src"].startswith("data:image/png;base64,") and img["alt"]
    assert "1.888 bits per byte" in html
    # A run's command line is shown as text, never run as markup.
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_the_metrics_read_as_people_write_numbers(tmp_path) -> None:
    page = _page(train_report_html("r", _run_files(tmp_path, "python -m gpt train-gpt")))
    metrics = page.cells[-10:]  # the last table: the final metrics, a name and a value each
    cells = dict(zip(metrics[0::2], metrics[1::2], strict=True))
    assert cells["tokens_per_s"] == "12,345 tokens/s"
    assert cells["steps"] == "100"
    assert cells["val_bits_per_byte"] == "1.888 bits/byte"
    assert not any(re.search(r"\de[+-]\d", cell) for cell in page.cells)


def test_a_curve_that_did_not_come_back_is_said_in_words(tmp_path) -> None:
    files = _run_files(tmp_path, "python -m gpt train-gpt")
    del files[LOSS_PNG]
    html = train_report_html("r", files)
    assert "<img" not in html and "<h1>" in html
    assert f"{LOSS_PNG} was not carried back" in html


def test_a_fine_tuned_runs_start_becomes_metrics_metadata() -> None:
    record = {"init_from": "hf://openai-community/gpt2", "revision": "abc", "weights_sha256": "f0"}
    assert train_provenance({INIT_FROM_JSON: json.dumps(record).encode()}) == {
        "init_from": "hf://openai-community/gpt2", "init_from_revision": "abc",
        "init_from_weights_sha256": "f0",
    }  # fmt: skip
    # A local directory has no revision; a run from scratch has no record at all.
    record = {"init_from": "/gpt/a/model", "revision": None, "weights_sha256": "f0"}
    assert train_provenance({INIT_FROM_JSON: json.dumps(record).encode()}) == {
        "init_from": "/gpt/a/model", "init_from_weights_sha256": "f0"}
    assert train_provenance({}) == {}


def test_a_chat_transcript_reads_as_its_conversations() -> None:
    def record(conversation: str, system: str, prompt: str, reply: str) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        return json.dumps({"conversation": conversation, "messages": messages,
                           "prompt": prompt, "reply": reply})  # fmt: skip

    lines = [record("a1", "Be brief.", "Hi", "Hello."), record("a1", "Be brief.", "And?", "So."),
             record("b2", "", "Again", "Yes.")]
    md = transcript_markdown("r", {TRANSCRIPT_JSONL: "\n".join(lines).encode()})
    assert md.index("## Conversation `a1`") < md.index("_System prompt:_ Be brief.") < md.index(
        "### 1\n\n> Hi") < md.index("### 2\n\n> And?") < md.index("## Conversation `b2`") < (
        md.index("### 3\n\n> Again"))
    assert md.count("_System prompt:_") == 1
