"""The one exception type for bad input from a person or an earlier stage."""


class InputError(Exception):
    """Bad input: reported by the CLI as one line naming the input and the reason, exit code 2.

    Raise it (or `ValueError` from a config's `__post_init__`) before anything is written, so a
    failed stage leaves nothing half-written behind.
    """
