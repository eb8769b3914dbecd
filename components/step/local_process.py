"""The local backend: run a stage as a process on this machine instead of in a TrainJob.

The command is the one a TrainJob container runs (`python -m gpt <stage> ...`, or torchrun with
several processes: gpt/stages.py's `Stage.command`), so a pipeline that works locally exercises
the same contract as on a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable

from components.trainjob.placement import Placement
from components.trainjob.stagelog import LOG_TAIL_LINES
from gpt.distributed.orphans import die_with_parent
from gpt.stages import Stage


def command(stage: Stage, args: list[str], num_proc_per_node: int = 1) -> list[str]:
    """The process to start: this interpreter, through torchrun when more than one process."""
    if num_proc_per_node > 1:
        torchrun = [sys.executable, "-m", "gpt.distributed.torchrun", "--standalone",
                    f"--nproc_per_node={num_proc_per_node}"]
        return stage.command(args, torchrun=torchrun)
    return stage.command(args, python=[sys.executable])


def environment(num_proc_per_node: int) -> dict[str, str]:
    """This environment, with the CPU's threads shared out between the processes.

    Several ranks each using every core oversubscribe the CPU and run slower than one rank.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if num_proc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_proc_per_node))
    return env


def run_as_process(
    stage: Stage,
    args: list[str],
    placement: Placement,
    say: Callable[[str], None] = print,
) -> None:
    """Run the stage to the end, echoing its output; raise with the output's tail if it fails.

    stdin is closed: the prompt stage answers its --prompt values and exits, and without prompts
    its interactive loop sees end-of-input at once instead of waiting on a pipeline step.
    """
    num_proc_per_node, timeout = placement.num_proc_per_node, placement.timeout
    cmd = command(stage, args, num_proc_per_node)
    say("running: " + shlex.join(cmd))
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)

    def echo(line: str) -> None:
        say(line)
        tail.append(line)

    code = _run(cmd, environment(num_proc_per_node), timeout, echo)
    if code is None:
        raise TimeoutError(f"{stage.prog} did not finish within {timeout:g} s; stopped it")
    if code != 0:
        raise RuntimeError(
            f"{stage.prog} exited with code {code}. Output tail:\n" + "\n".join(tail)
        )


def _run(
    cmd: list[str], env: dict[str, str], timeout: float, echo: Callable[[str], None]
) -> int | None:
    """Run `cmd`, each line of its output to `echo`; its exit status, or None when it was killed
    for running past `timeout` seconds. Nothing of it outlives this call."""
    expired = threading.Event()
    with subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        # Its own process group, so torchrun's workers end with it; and it ends with us, even
        # when we are killed with SIGKILL and cannot kill it ourselves.
        start_new_session=True,
        preexec_fn=die_with_parent,
    ) as proc:

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        def expire() -> None:
            expired.set()
            kill()

        # Reading the output blocks on the pipe, so the deadline is a timer that kills the process.
        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                echo(line.rstrip("\n"))
            code = proc.wait()
        finally:
            timer.cancel()
            kill()  # leftovers of a finished run, or all of it if we were interrupted
    return None if expired.is_set() else code
