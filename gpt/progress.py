"""Progress of a long pass over a corpus: MB done, MB/s, tokens, ETA, on one line.

On a terminal the line is rewritten in place a few times a second; in a log (a pod's, a file) a
new line is printed every few seconds, so a log stays short and still shows the run is alive.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Call `update` after each chunk and `done` at the end; quiet for passes shorter than the
    first interval."""

    def __init__(self, what: str, total_bytes: int, out: TextIO | None = None) -> None:
        self.what, self.total = what, total_bytes
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.every = 0.5 if self.tty else 5.0
        self.last = time.monotonic()
        self.nbytes = self.tokens = 0
        # The rate counts from the first chunk on: what comes before it (cleaning's first pass,
        # which checks the bytes, or a download) is not this pass's speed.
        self.start: tuple[float, int] | None = None
        self.shown = False

    def update(self, nbytes: int, tokens: int = 0) -> None:
        now = time.monotonic()
        first = self.start is None
        if first:
            self.start = (now, nbytes)
        self.nbytes += nbytes
        self.tokens += tokens
        if now - self.last >= self.every and not first:
            self.last = now
            self._show(now)

    def done(self) -> None:
        if self.shown and self.tty:
            self._show(time.monotonic())
            self.out.write("\n")
            self.out.flush()

    def _show(self, now: float) -> None:
        since, first = self.start or (now, 0)
        rate = (self.nbytes - first) / max(now - since, 1e-9)
        line = f"corpus: {self.what} {self.nbytes / 1e6:,.1f}"
        line += f"/{self.total / 1e6:,.1f} MB" if self.total else " MB"
        line += f", {rate / 1e6:.1f} MB/s"
        line += f", {self.tokens:,} tokens" if self.tokens else ""
        if self.total and rate:  # the size of a download without a length is not known
            line += f", ETA {_clock(max(self.total - self.nbytes, 0) / rate)}"
        self.out.write(f"\r{line}\033[K" if self.tty else line + "\n")
        self.out.flush()
        self.shown = True


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
