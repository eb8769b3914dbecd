"""`python pid1.py PROGRAM [ARGS...]`: run PROGRAM as PID 1 of a new PID namespace, as a container
runtime starts a container's first process (runc v1.3.0: clone with CLONE_NEWPID), and exit with
its status (a signal N as 128 + N, as containerd reports it).

What that buys the test cluster is the kernel's treatment of PID 1 (pid_namespaces(7)): a
signal it has no handler for is dropped, SIGKILL included only from inside, and when it ends
every other process of the namespace is killed. util-linux `unshare --fork` does the same but
prints a spurious error into the container's log and loses the signal in its exit status.
Needs CAP_SYS_ADMIN (root); stdlib only.
"""

import ctypes
import os
import signal
import sys

CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(CLONE_NEWPID) != 0:
    sys.exit(f"pid1: unshare(CLONE_NEWPID): {os.strerror(ctypes.get_errno())}")
pid = os.fork()  # the first child of the caller after unshare is the namespace's PID 1
if pid == 0:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a kubelet's SIGKILL of us ends it too
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        # runc fails the start; containerd v2.1.4 reports the container exited with 128
        # (internal/cri/server/helpers.go errorStartExitCode, reason StartError).
        print(f"pid1: exec {sys.argv[1]}: {e.strerror}", file=sys.stderr)
        os._exit(128)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # signals are for the container, not for us
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
sys.exit(128 - code if code < 0 else code)
