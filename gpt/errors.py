"""The one exception type for bad input from a person or an earlier stage (and a full volume,
reported the same way), and the exit statuses every stage shares."""

from __future__ import annotations

from pathlib import Path

EXIT_FATAL = 2
"""Bad input, a diverged loss, a busy run, a full volume: the same command would fail the same
way again (a full volume until someone frees space). The train runtime's Job fails at once on it
(runtimes/gpt-train-gpt.yaml, podFailurePolicy), where another failure restarts the JobSet.
argparse exits 2 on a bad flag, too."""
EXIT_STOPPED = 75
"""Stopped by a signal (SIGTERM, SIGINT) after writing a checkpoint: running the same command
again resumes there. 75 is EX_TEMPFAIL of sysexits.h: "try again later"."""


class InputError(Exception):
    """Bad input: reported by the CLI as one line naming the input and the reason, exit status
    EXIT_FATAL.

    Raise it (or `ValueError` from a config's `__post_init__`) before anything is written, so a
    failed stage leaves nothing half-written behind.
    """


class DiskFull(InputError):
    """No space left (ENOSPC), or no quota left (EDQUOT), on the volume while writing `path`.

    Reported like bad input, one line and EXIT_FATAL: a retry fails the same way until someone
    frees space. gpt/rundir/atomic.py's writers raise it once their temporary files are gone, so
    what was there before the write is all that is left.
    """

    def __init__(self, path: Path | str, what: str) -> None:
        self.path, self.what = Path(path), what
        super().__init__(
            f"no space left on {path} (writing {what}): free space or use a larger volume"
        )


def first_line(e: BaseException) -> str:
    """An exception's message cut to one line (for the one-line errors), or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
