"""A stage's output as a component reads it: the run-directory files it carries, and its tail.

On a cluster the step may not mount the PVC the stage writes to, but it may read pod logs: so
the TrainJob's container runs the stage, then prints the files the component turns into KFP
artifacts, base64-encoded between two marker lines (`container_command`), and the component
reads them back from the pod's log (`CarriedFiles`, `files_from_log`). The format is this
module's alone.

What is carried is bounded, so that it fits well inside one file of the kubelet's log rotation
(10 MiB by default): a `.jsonl` file of more than CARRY_MAX_RECORDS records is thinned to that
many (`thin`), and a file still over CARRY_MAX_BYTES is not carried; a line of the log says so,
and the whole file stays in the run directory. Each block names its size and sha256, so a block
cut or thinned by the log's path arrives whole or not at all.

The pod has Python (the workload image runs the stages with it) but not this package: it runs
this module's own source (`python3 -c`, the `__main__` block at the end), stdlib only, as the
container's first process, which also passes SIGTERM on to the stage (`supervise`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

# Lines of a stage's output a failure shows (a TrainJob's pod log, or a local process's output).
LOG_TAIL_LINES = 40
# The bound on what one carried file adds to the log: 1000 train.jsonl records are about 200 KB;
# report.md and loss.png are tens of KB. At most 4/3 x 512 KiB of base64 per file.
CARRY_MAX_RECORDS = 1000
CARRY_MAX_BYTES = 512 * 1024

MARKER = "gpt-trainjobs"
BEGIN = f"==> {MARKER} file {{}} {{}} sha256:{{}} <=="
END = f"<== {MARKER} end <=="
_BEGIN_LINE = re.compile(rf"^==> {MARKER} file (\S+) (\d+) sha256:([0-9a-f]{{64}}) <==$")


def container_command(rundir: str, files: Iterable[str]) -> list[str]:
    """The container's command: this module's source as the pod's first process, which runs the
    stage (the TrainJob's args) as its child (`supervise`), then prints `files` of `rundir` as
    carried blocks.

    Only node 0 prints (PET_NODE_RANK is set by the Trainer's torch policy); a missing file is
    skipped, not an error, so a stage that legitimately writes nothing still succeeds.
    """
    return ["python3", "-c", Path(__file__).read_text(), rundir, *files, "--"]


def supervise(program: list[str]) -> int:
    """Run `program` as this process's child and return its status (signal N: 128 + N),
    passing SIGTERM on.

    In a pod this process is the container's first, PID 1: the kubelet sends SIGTERM to it
    alone, and the kernel drops a signal that PID 1 has no handler for, so without this the
    stage would never hear of a deletion, a drain or a preemption, and would be SIGKILLed
    when the grace period ends, its checkpoint unwritten. SIGINT (Ctrl-C on the prompt pod's
    TTY) goes to the whole foreground process group, the stage included: here it is only kept
    from ending the first process.
    """
    child: subprocess.Popen | None = None
    early: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if child is None:
            early.append(signum)
        else:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    child = subprocess.Popen(program)  # a signal caught meanwhile is sent once it exists
    for signum in early:
        child.send_signal(signum)
    status = child.wait()
    return 128 - status if status < 0 else status


def thin(lines: list[bytes], limit: int) -> list[bytes]:
    """At most `limit` of `lines`, in order: the last; the evaluations (train.jsonl records with
    a `val_loss`) spread over up to half of `limit`, so every one while they fit; the others
    spread over the rest. Spread means evenly spaced, first and last included."""
    if len(lines) <= limit:
        return lines
    evals = [i for i, line in enumerate(lines) if b'"val_loss"' in line]
    keep = {len(lines) - 1, *_spread(evals, limit // 2)}
    rest = [i for i in range(len(lines)) if i not in keep]
    keep.update(_spread(rest, limit - len(keep)))
    return [lines[i] for i in sorted(keep)]


def _spread(items: list[int], k: int) -> list[int]:
    if k >= len(items):
        return items
    if k <= 1:
        return items[-1:] if k == 1 else []
    return [items[round(j * (len(items) - 1) / (k - 1))] for j in range(k)]


def carry(rundir: Path, rels: Iterable[str], out: TextIO | None = None) -> None:
    """Print each existing file of `rundir` as one block, bounded as the module says."""
    out = out or sys.stdout
    for rel in rels:
        path = rundir / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        if rel.endswith(".jsonl"):
            lines = data.splitlines(keepends=True)
            kept = thin(lines, CARRY_MAX_RECORDS)
            if len(kept) < len(lines):
                data = b"".join(kept)
                print(f"{MARKER}: {rel} carried thinned to {len(kept)} of {len(lines)} "
                      f"records; all of them stay in {path}", file=out)  # fmt: skip
        if len(data) > CARRY_MAX_BYTES:
            print(f"{MARKER}: {rel} not carried: {len(data)} bytes, over {CARRY_MAX_BYTES}; "
                  f"it stays in {path}", file=out)  # fmt: skip
            continue
        print(BEGIN.format(rel, len(data), hashlib.sha256(data).hexdigest()), file=out)
        print(base64.encodebytes(data).decode(), end="", file=out)
        print(END, file=out)
    out.flush()


class CarriedFiles:
    """Reads a stage's log line by line: the carried files, and what a reader sees.

    Holds only the block being read, so a log of any length can be streamed through it.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        """Every whole block read so far, by its path in the run directory (the last wins)."""
        self._block: tuple[str, int, str] | None = None
        self._chunks: list[str] = []

    def feed(self, raw: str) -> str | None:
        """Take one line; return it as a reader sees it, or None inside a block."""
        line = raw.strip()  # a TTY turns \n into \r\n
        if m := _BEGIN_LINE.match(line):
            self._block, self._chunks = (m.group(1), int(m.group(2)), m.group(3)), []
            return f"[{MARKER} file {m.group(1)} carried back]"
        if self._block is None:
            return raw.rstrip("\r\n")
        if line == END:
            self._close()
        else:
            self._chunks.append(line)
        return None

    def _close(self) -> None:
        rel, size, digest = self._block
        self._block = None
        try:
            data = base64.b64decode("".join(self._chunks), validate=True)
        except binascii.Error:
            return  # a block cut by the log's path: the file is missing, never wrong
        if len(data) == size and hashlib.sha256(data).hexdigest() == digest:
            self.files[rel] = data


def files_from_log(log: str) -> dict[str, bytes]:
    """The files `container_command` printed into `log` whole (the last copy of each wins)."""
    reader = CarriedFiles()
    for line in log.splitlines():
        reader.feed(line)
    return reader.files


def visible(log: str) -> str:
    """The log without the base64 blocks, which mean nothing to a reader."""
    reader = CarriedFiles()
    shown = (reader.feed(line) for line in log.splitlines())
    return "\n".join(line for line in shown if line is not None)


def tail(log: str) -> str:
    """The last LOG_TAIL_LINES lines a reader would see of `log`."""
    return "\n".join(visible(log).splitlines()[-LOG_TAIL_LINES:])


if __name__ == "__main__":  # in the pod: python3 -c SOURCE RUNDIR FILE... -- PROGRAM...
    dash = sys.argv.index("--")
    status = supervise(sys.argv[dash + 1 :])
    if status == 0 and os.environ.get("PET_NODE_RANK", "0") == "0":
        carry(Path(sys.argv[1]), sys.argv[2:dash])
    sys.exit(status)
