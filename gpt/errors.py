"""The one exception type for bad input from a person or an earlier stage."""

from __future__ import annotations


class InputError(Exception):
    """Bad input: reported by the CLI as one line naming the input and the reason, exit code 2.

    Raise it (or `ValueError` from a config's `__post_init__`) before anything is written, so a
    failed stage leaves nothing half-written behind.
    """


def first_line(e: BaseException) -> str:
    """An exception's message cut to one line (for the one-line errors), or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
