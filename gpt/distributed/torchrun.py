"""`python -m gpt.distributed.torchrun [torchrun options] -m gpt -- <stage> ...`: torchrun, exiting
with its workers' status.

torchrun itself exits 1 whatever its workers exited with, and with a traceback. What the cluster
does next depends on the status (runtimes/gpt-train-gpt.yaml: EXIT_FATAL fails the Job at once,
another failure restarts the JobSet), so this passes the workers' status on:

- a worker failed: the first failure's status (a signal N as 128 + N, as a shell says it);
  EXIT_FATAL if any worker exited EXIT_FATAL, since a bad flag fails every rank alike;
- torchrun itself got SIGTERM or SIGINT: it has sent the same signal to every worker and given
  them `--shutdown_timeout` seconds to stop, which they spend writing a checkpoint
  (gpt/training/stopping.py); EXIT_STOPPED.

torchrun's own shutdown timeout is 30 s; here it is SHUTDOWN_TIMEOUT_S unless given, within the
train runtime's terminationGracePeriodSeconds (runtimes/gpt-train-gpt.yaml).
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from gpt.errors import EXIT_FATAL, EXIT_STOPPED

SHUTDOWN_TIMEOUT_S = 100


def worker_status(e: ChildFailedError) -> int:
    codes = [f.exitcode for _, f in sorted(e.failures.items())]
    if EXIT_FATAL in codes:
        return EXIT_FATAL
    code = codes[0] if codes else 1
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if not any(a.startswith(("--shutdown_timeout", "--shutdown-timeout")) for a in argv):
        argv = [f"--shutdown_timeout={SHUTDOWN_TIMEOUT_S}", *argv]
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        status = worker_status(e)
        print(f"torchrun: a worker exited with status {status} (its log above says why)",
              file=sys.stderr)
        return status
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"torchrun: {name}: the workers were told to stop at a checkpoint", file=sys.stderr)
        return EXIT_STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
