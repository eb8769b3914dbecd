"""A stage's output as a component reads it: the run-directory files it carries, and its tail.

On a cluster the step runs in `kubeflow` and cannot mount the PVC of `training`, but its Role may
read pod logs there: so the TrainJob's container runs the stage, then prints the files the
component turns into KFP artifacts, base64-encoded between two marker lines (`emit_script`), and
the component reads them back from the pod's log (`files_from_log`). The format is this module's
alone.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from collections.abc import Iterable

# Lines of a stage's output a failure shows (a TrainJob's pod log, or a local process's output).
LOG_TAIL_LINES = 40

MARKER = "gpt-trainjobs"
BEGIN = f"==> {MARKER} file {{}} <=="
END = f"<== {MARKER} end <=="
_BEGIN_LINE = re.compile("^" + re.escape(BEGIN).replace(re.escape("{}"), "(.+)") + "$")


def emit_script(rundir: str, files: Iterable[str]) -> str:
    """Shell that runs the stage (`"$@"`), then prints `files` of `rundir` base64-encoded.

    Only node 0 prints (PET_NODE_RANK is set by the Trainer's torch policy); a missing file is
    skipped, not an error, so a stage that legitimately writes nothing still succeeds.
    """
    lines = ['"$@" || exit $?', 'if [ "${PET_NODE_RANK:-0}" = 0 ]; then']
    for rel in files:
        path = shlex.quote(f"{rundir}/{rel}")
        lines.append(
            f"  if [ -f {path} ]; then echo {shlex.quote(BEGIN.format(rel))}; "
            f"base64 {path}; echo {shlex.quote(END)}; fi"
        )
    lines.append("fi")
    return "\n".join(lines)


def files_from_log(log: str) -> dict[str, bytes]:
    """The files `emit_script` printed into `log` (the last copy of each wins)."""
    found: dict[str, bytes] = {}
    current: str | None = None
    chunks: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()  # a TTY turns \n into \r\n
        m = _BEGIN_LINE.match(line)
        if m:
            current, chunks = m.group(1), []
        elif line == END and current is not None:
            try:
                found[current] = base64.b64decode("".join(chunks), validate=True)
            except binascii.Error:
                pass  # a block cut by the log's size limit: report it as missing
            current = None
        elif current is not None:
            chunks.append(line)
    return found


def visible(log: str) -> str:
    """The log without the base64 blocks, which mean nothing to a reader."""
    out, inside = [], False
    for line in log.splitlines():
        m = _BEGIN_LINE.match(line.strip())
        if m:
            inside = True
            out.append(f"[{MARKER} file {m.group(1)} carried back]")
        elif line.strip() == END:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def tail(log: str) -> str:
    """The last LOG_TAIL_LINES lines a reader would see of `log`."""
    return "\n".join(visible(log).splitlines()[-LOG_TAIL_LINES:])
