"""Built images as the test cluster's kubelet runs them: each image's root filesystem (a Buildah
working container, mounted) and the parts of its config a container runtime applies (Env,
WorkingDir, User), so a pod's container runs from its image instead of this machine's venv.

kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go (generateContainerConfig): the
container's env is the image's with the pod spec's on top (containerd's WithEnv merges by name),
its working directory the spec's `workingDir` else the image's, its user the securityContext's
runAsUser/runAsGroup else the image's USER; fsGroup and supplementalGroups join its groups.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Starts a container's first process as PID 1 of its own PID namespace.
PID1 = Path(__file__).with_name("pid1.py")
# Runs it in an image's root filesystem as the pod's user.
CONTAINER = Path(__file__).with_name("container.py")


@dataclass(frozen=True)
class Image:
    """One image's root filesystem and run-time config."""

    name: str
    rootfs: Path
    env: dict[str, str]
    workdir: str
    user: str
    """The image's USER (`1000:1000`, or "" for root)."""

    def identity(self, pod_spec: dict[str, Any],
                 container: dict[str, Any]) -> tuple[int, int, list[int]]:  # fmt: skip
        """(uid, gid, groups) of the container's process."""
        pod_ctx = pod_spec.get("securityContext") or {}
        ctx = {**pod_ctx, **(container.get("securityContext") or {})}
        image_uid, _, image_gid = self.user.partition(":")
        uid = int(ctx.get("runAsUser", image_uid or 0))
        gid = int(ctx.get("runAsGroup", image_gid or 0))
        groups = [gid, *([pod_ctx["fsGroup"]] if "fsGroup" in pod_ctx else []),
                  *pod_ctx.get("supplementalGroups", [])]  # fmt: skip
        return uid, gid, sorted(set(groups))

    def own_identity(self) -> tuple[int, int, list[int]]:
        """(uid, gid, groups) of the image's USER, as `docker run` without --user runs it."""
        return self.identity({}, {})

    def environment(self, container_env: dict[str, str], uid: int) -> dict[str, str]:
        """The image's env under the container's; HOME, where neither sets it, the user's home
        in the image's /etc/passwd, else / (runc libcontainer/init_linux.go, setupUser)."""
        env = {**self.env, **container_env}
        if "HOME" not in env:
            passwd = (self.rootfs / "etc" / "passwd").read_text().splitlines()
            homes = {int(f[2]): f[5] for f in (line.split(":") for line in passwd) if len(f) > 5}
            env["HOME"] = homes.get(uid, "/")
        return env

    def cwd(self, container: dict[str, Any]) -> str:
        return container.get("workingDir") or self.workdir or "/"


def container_command(image: Image, spec_file: Path, argv: list[str], env: dict[str, str],
                      mounts: dict[str, Path], identity: tuple[int, int, list[int]],
                      cwd: str) -> list[str]:  # fmt: skip
    """The command that runs `argv` in `image` (cluster/container.py as PID 1 of its own PID
    namespace, cluster/pid1.py), its SPEC written to `spec_file`; `env` goes over the image's,
    `mounts` maps container paths to folders here."""
    uid, gid, groups = identity
    spec = {"rootfs": str(image.rootfs), "uid": uid, "gid": gid, "groups": groups, "cwd": cwd,
            "env": image.environment(env, uid), "argv": argv,
            "mounts": [[str(folder), path] for path, folder in mounts.items()]}  # fmt: skip
    spec_file.write_text(json.dumps(spec, indent=1))
    return [sys.executable, str(PID1), sys.executable, str(CONTAINER), str(spec_file)]


def set_volume_ownership(folder: Path, fs_group: int) -> None:
    """kubernetes pkg/volume/volume_linux.go (SetVolumeOwnership): every file of the volume gets
    group fsGroup and its group's read/write bits (directories also setgid and g+x), unless the
    root already has that group (fsGroupChangePolicy OnRootMismatch)."""
    if folder.stat().st_gid == fs_group:
        return
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, -1, fs_group, follow_symlinks=False)
        if path.is_symlink():
            continue
        mode = path.stat().st_mode | 0o060
        os.chmod(path, mode | 0o2010 if path.is_dir() else mode)


@contextlib.contextmanager
def mounted(name: str, tool: str = "buildah") -> Iterator[Image]:
    """`name`'s root filesystem, mounted for the block's duration (a working container, removed
    after: what the pods wrote outside their volumes goes with it)."""
    ctr = subprocess.run([tool, "from", "--pull-never", "--quiet", name], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    try:
        rootfs = subprocess.run([tool, "mount", ctr], check=True, capture_output=True,
                                text=True).stdout.strip()  # fmt: skip
        inspect = subprocess.run([tool, "inspect", "--type", "image", name], check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
        config = json.loads(inspect)["OCIv1"]["config"]
        env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
        yield Image(name, Path(rootfs), env, config.get("WorkingDir", ""), config.get("User", ""))
    finally:
        subprocess.run([tool, "rm", ctr], capture_output=True)
