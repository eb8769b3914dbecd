"""Progress of a long pass: one line rewritten on a terminal, a line every few seconds in a log."""

from __future__ import annotations

import io
import time

from gpt.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_with_mb_rate_tokens_and_eta() -> None:
    out = io.StringIO()
    p = Progress("tokenized", 10_000_000, out)
    assert p.every == 5.0  # not a terminal
    p.update(1_000_000, 250_000)  # before the first interval: quiet
    assert out.getvalue() == ""
    p.every = 0.0
    p.update(1_000_000, 250_000)
    line = out.getvalue()
    assert line.startswith("corpus: tokenized 2.0/10.0 MB, ") and line.endswith("\n")
    assert " MB/s, 500,000 tokens, ETA " in line and "\r" not in line
    p.done()
    assert out.getvalue() == line  # a log needs no closing line


def test_a_terminal_gets_one_line_rewritten_in_place() -> None:
    out = Terminal()
    p = Progress("cleaned", 0, out)  # size unknown (a download without a length): no ETA
    p.every = 0.0
    p.update(3_000_000)  # the first chunk starts the clock: no rate to show yet
    p.update(3_000_000)
    p.update(3_000_000)
    p.done()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "corpus: cleaned 9.0 MB, " in text and "ETA" not in text and "tokens" not in text


def test_the_rate_counts_from_the_first_chunk_not_from_the_setup_before_it(monkeypatch) -> None:
    # Cleaning reads a document twice and reports the second pass: the seconds of the first
    # must not make a 2 GB pass look like 0.1 MB/s and five hours.
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    p = Progress("cleaned", 2_000_000_000, out)
    clock[0] += 10.0  # the first pass
    p.update(1_000_000)
    clock[0] += 1.0
    p.update(100_000_000)
    assert "cleaned 101.0/2,000.0 MB, 100.0 MB/s, ETA 0:19" in out.getvalue()
