"""A model server a test starts as a process of its own (`transformers serve`, KServe's
huggingfaceserver): ports for it, and the wait until it answers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free now: all bound at once (one after another, a port closed can come
    back as the next), then let go for the server to bind."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def wait_until_answering(url: str, server: subprocess.Popen, log: Path, deadline_s: float,
                         what: str) -> None:  # fmt: skip
    """Until a GET of `url` answers, failing with the tail of `log` where `server` exits and
    when `deadline_s` pass. Directly, whatever proxy the environment names: the server is on
    this machine."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + deadline_s
    while True:
        try:
            with opener.open(url, timeout=2):
                return
        except OSError:
            assert server.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < end, f"{what} did not start"
            time.sleep(0.5)
