"""Built images as the test cluster's kubelet runs them: each image's root filesystem (a Buildah
working container, mounted) and the parts of its config a container runtime applies (Env,
WorkingDir, User, Entrypoint, Cmd), so a pod's container runs from its image instead of this
machine's venv.

Read from upstream at these versions: kubernetes v1.33 (its repository is too large to fetch
here: read file by file from a stored index, generateContainerConfig at commit fbba6b47, a tree
with v1.33's pod allocation manager), containerd v2.1.4 (the CRI runtime of a v1.33 node) and
runc v1.3.0 (the runc containerd v2.1 ships), both read at their tags:
- kubernetes v1.33 `pkg/kubelet/kuberuntime/kuberuntime_container.go` (generateContainerConfig):
  the spec's command, args, workingDir and env go to the runtime as they are; `security_context.go`
  (determineEffectiveSecurityContext): the container's securityContext fields over the pod's, the
  image's user (`helpers.go` getImageUser: its uid if numeric, else its name; none: 0) where
  runAsUser is unset, fsGroup then supplementalGroups as supplemental groups;
  `security_context_others.go` (verifyRunAsNonRoot): runAsNonRoot refuses uid 0 and a
  non-numeric user (CreateContainerConfigError).
- containerd v2.1.4 `internal/cri/opts/spec_opts.go` (WithProcessArgs): no command takes the
  image's Entrypoint (unless `[""]`), no command and no args its Cmd, neither: "no command
  specified"; `internal/cri/server/container_create.go` (buildContainerSpec): workingDir else the
  image's WorkingDir, env the default PATH (`pkg/oci/spec_opts_nonwindows.go` WithDefaultPathEnv),
  the image's Env, the spec's on top (`pkg/oci/spec_opts.go` replaceOrAppendEnvValues);
  `internal/cri/util/util.go` (GenerateUserString): "uid[:runAsGroup]"; `pkg/oci/spec_opts.go`
  (WithUser, WithUserID, WithUsername): a numeric user alone takes its group from the image's
  /etc/passwd (0 if absent), so the image USER's group is not used where runAsGroup is unset,
  and a name must be there ("no users found"); `internal/cri/server/container_create_linux.go`
  (containerSpecOpts) and `internal/cri/opts/spec_opts.go` (WithAdditionalGIDs,
  WithSupplementalGroups): the groups are the primary group, under supplementalGroupsPolicy
  Merge (the default) the image's /etc/group groups listing the user, and the pod's
  supplemental groups, sorted, each once.
- runc v1.3.0 `libcontainer/env.go` (prepareEnv): HOME, where unset or empty, the user's home
  in the image's /etc/passwd, else /.
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
# containerd v2.1.4 pkg/oci/spec.go (defaultUnixEnv): PATH where the image sets none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# containerd v2.1.4 pkg/oci/spec_opts.go (WithUser): runc takes ids up to MaxInt32.
MAX_ID = 2**31 - 1


class CreateContainerError(Exception):
    """Why the kubelet cannot create a pod's container: `reason` is the container's waiting
    reason (kubernetes v1.33 pkg/kubelet/kuberuntime/kuberuntime_container.go, startContainer:
    CreateContainerConfigError before the runtime is called, CreateContainerError from it)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def _config_error(message: str) -> CreateContainerError:
    return CreateContainerError("CreateContainerConfigError", message)


def _runtime_error(message: str) -> CreateContainerError:
    return CreateContainerError("CreateContainerError",
                                f"failed to create containerd container: {message}")  # fmt: skip


def _numeric(text: str) -> int | None:
    """`text` as a user or group id, as WithUser parses one (else a name)."""
    return int(text) if text.isdigit() and int(text) <= MAX_ID else None


@dataclass(frozen=True)
class Image:
    """One image's root filesystem and run-time config."""

    name: str
    rootfs: Path
    env: dict[str, str]
    workdir: str
    user: str
    """The image's USER (`1000:1000`, `gpt`, or "" for root)."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def _table(self, name: str) -> list[list[str]]:
        """The image's /etc/passwd or /etc/group as rows of fields (none if it has no file)."""
        path = self.rootfs / "etc" / name
        lines = path.read_text().splitlines() if path.exists() else []
        return [line.split(":") for line in lines if line and not line.startswith("#")]

    def _passwd(self, match: str, value: str | int) -> list[str] | None:
        """The first /etc/passwd entry whose name (match "name") or uid ("uid") is `value`."""
        field = 0 if match == "name" else 2
        return next((f for f in self._table("passwd")
                     if len(f) > 6 and f[field] == str(value)), None)  # fmt: skip

    def _resolve(self, user: str, group: int | None) -> tuple[int, int]:
        """(uid, gid) of the user string "user[:group]" the kubelet's settings make (WithUser;
        `group` is runAsGroup, so numeric): a uid alone takes its /etc/passwd entry's group, else
        0 (WithUserID); a name must have an entry (WithUsername)."""
        uid = _numeric(user)
        entry = self._passwd("name" if uid is None else "uid", user)
        if uid is None:
            if entry is None:
                raise _runtime_error("no users found")
            uid = int(entry[2])
        if group is not None:
            return uid, group
        return uid, int(entry[3]) if entry else 0

    def _member_of(self, user: str) -> list[int]:
        """WithAdditionalGIDs: the gids of the /etc/group groups listing the user (a name, or
        a uid named in /etc/passwd) as a member, its own-named group aside."""
        if _numeric(user) is not None:
            entry = self._passwd("uid", user)
            if entry is None:
                return []
            user = entry[0]
        return [int(g[2]) for g in self._table("group")
                if len(g) > 3 and g[0] != user and user in g[3].split(",")]  # fmt: skip

    def identity(self, pod_spec: dict[str, Any],
                 container: dict[str, Any]) -> tuple[int, int, list[int]]:  # fmt: skip
        """(uid, gid, groups) of the container's process; CreateContainerError where the
        kubelet or the runtime refuses the container."""
        pod_ctx = pod_spec.get("securityContext") or {}
        ctx = {**pod_ctx, **(container.get("securityContext") or {})}
        image_user = self.user.partition(":")[0]
        run_as_user, username = ctx.get("runAsUser"), ""
        if run_as_user is None:  # getImageUser: the image's uid, else its user name, else 0
            run_as_user = _numeric(image_user) if image_user else 0
            username = image_user if run_as_user is None else ""
        if ctx.get("runAsNonRoot"):
            if ctx.get("runAsUser") == 0:
                raise _config_error("container's runAsUser breaks non-root policy")
            if run_as_user == 0:
                raise _config_error("container has runAsNonRoot and image will run as root")
            if username:
                raise _config_error(f"container has runAsNonRoot and image has non-numeric user "
                                    f"({username}), cannot verify user is non-root")  # fmt: skip
        user = username or str(run_as_user)  # GenerateUserString, then WithUser
        uid, gid = self._resolve(user, ctx.get("runAsGroup"))
        policy = pod_ctx.get("supplementalGroupsPolicy", "Merge")
        if policy not in ("Merge", "Strict"):
            raise _config_error(f"unsupported supplementalGroupsPolicy: {policy}")
        groups = [gid, *(self._member_of(user) if policy == "Merge" else []),
                  *([pod_ctx["fsGroup"]] if "fsGroup" in pod_ctx else []),
                  *pod_ctx.get("supplementalGroups", [])]  # fmt: skip
        return uid, gid, sorted(set(groups))

    def own_identity(self) -> tuple[int, int, list[int]]:
        """(uid, gid, groups) of the image's USER, as a pod with no securityContext runs it."""
        return self.identity({}, {})

    def argv(self, container: dict[str, Any]) -> list[str]:
        """The container's process: its command, else the image's Entrypoint, then its args,
        else (no command either) the image's Cmd (WithProcessArgs)."""
        command, args = container.get("command") or [], container.get("args") or []
        if not command:
            args = args or list(self.cmd)
            command = [] if list(self.entrypoint) == [""] else list(self.entrypoint)
        if not command and not args:
            raise CreateContainerError(
                "CreateContainerError",
                "failed to generate container spec: failed to generate spec: no command specified")
        return [*command, *args]

    def environment(self, container_env: dict[str, str], uid: int) -> dict[str, str]:
        """The default PATH, the image's env over it, the container's over that; HOME, where
        none sets it or it is empty, the user's home in the image's /etc/passwd, else /."""
        env = {"PATH": DEFAULT_PATH, **self.env, **container_env}
        if not env.get("HOME"):
            entry = self._passwd("uid", uid)
            env["HOME"] = entry[5] if entry else "/"
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


def set_volume_ownership(folder: Path, fs_group: int, policy: str | None = None) -> None:
    """kubernetes v1.33 `pkg/volume/volume_linux.go` (SetVolumeOwnership): every file of the
    volume gets group fsGroup and its group's read/write bits (directories also setgid and g+x).
    fsGroupChangePolicy OnRootMismatch skips that where the root already has the group, g+rwx
    and setgid (requiresPermissionChange); unset or Always, it is done at every start."""
    root = folder.stat()
    if (policy == "OnRootMismatch" and root.st_gid == fs_group
            and root.st_mode & 0o770 == 0o770 and root.st_mode & 0o2000):  # fmt: skip
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
        yield Image(name, Path(rootfs), env, config.get("WorkingDir", ""), config.get("User", ""),
                    tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()))
    finally:
        subprocess.run([tool, "rm", ctr], capture_output=True)
