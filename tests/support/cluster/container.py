"""`python container.py SPEC.json`: exec a pod's container in its image's root filesystem, as a
container runtime does after it has made the namespaces (runc v1.3.0
`libcontainer/rootfs_linux.go` prepareRootfs: mounts, pivot_root, the working directory made
(MkdirAll 0755) where missing; `init_linux.go` finalizeNamespace and setupUser: chdir,
setgroups, setgid, setuid; `standard_init_linux.go` Init: the executable looked up in the
container's PATH, then execve).

Run as PID 1 of its own PID namespace (cluster/pid1.py starts it). SPEC names:
  rootfs   the image's root filesystem (`buildah mount`), shared by the image's pods
  mounts   [[host folder, container path], ...]: the pod's volumes (its PVC at /gpt, its /tmp)
  uid, gid, groups   the process's user, group and supplementary groups (fsGroup)
  cwd      the working directory inside the root filesystem
  env      the container's whole environment
  argv     the process: command + args, or the image's Entrypoint/Cmd (cluster/images.py)
A private mount namespace keeps every mount to this container; /proc is the new PID
namespace's own, /dev and /sys this machine's (/sys read-only, as containerd v2.1.4's default
spec mounts its sysfs: `pkg/oci/mounts.go`). chroot stands
in for pivot_root (same view for the process; the old root is not detached). Root only; stdlib.
"""

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18

libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                  flags, None) != 0:  # fmt: skip
        err = ctypes.get_errno()
        sys.exit(f"container: mount {source} on {target}: {os.strerror(err)}")


spec = json.loads(open(sys.argv[1]).read())
root = spec["rootfs"]
if libc.unshare(CLONE_NEWNS) != 0:
    sys.exit(f"container: unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
for source, path in [["/dev", "/dev"], *spec["mounts"]]:
    target = os.path.join(root, path.lstrip("/"))
    os.makedirs(target, exist_ok=True)
    mount(source, target, None, MS_BIND | MS_REC)
os.makedirs(os.path.join(root, "proc"), exist_ok=True)
mount("proc", os.path.join(root, "proc"), "proc", 0)  # this PID namespace's processes only
sysfs = os.path.join(root, "sys")
os.makedirs(sysfs, exist_ok=True)
mount("/sys", sysfs, None, MS_BIND | MS_REC)
mount("/sys", sysfs, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
os.chroot(root)
os.makedirs(spec["cwd"], 0o755, exist_ok=True)
os.chdir(spec["cwd"])
os.setgroups(spec["groups"])
os.setgid(spec["gid"])
os.setuid(spec["uid"])
try:
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
except OSError as e:
    # runc fails the start; containerd v2.1.4 reports the container exited with 128
    # (internal/cri/server/helpers.go errorStartExitCode, reason StartError).
    print(f"container: exec {spec['argv'][0]}: {e.strerror}", file=sys.stderr)
    os._exit(128)
