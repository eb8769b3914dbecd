"""The test cluster's image mode (cluster/images.py, cluster/container.py) against upstream:
how a pod's container and its image's config make the process (user, groups, env, argv,
working directory), and what the kubelet or the runtime refuses. Each rule's source, at its
version, is cited in cluster/images.py; these use a made-up image root filesystem, no buildah.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.cluster.images import (
    DEFAULT_PATH,
    CreateContainerError,
    Image,
    container_command,
    set_volume_ownership,
)

PASSWD = """root:x:0:0:root:/root:/bin/bash
gpt:x:1000:1000::/home/gpt:/usr/sbin/nologin
app:x:1001:1001::/home/app:/bin/sh
"""
GROUP = """root:x:0:
video:x:44:gpt,app
gpt:x:1000:
app:x:1001:gpt
"""
# The runtimes' pod securityContext (runtimes/*.yaml).
RUNTIME_POD = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                   "fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}}


def image(tmp_path: Path, user: str = "1000:1000", **config) -> Image:
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc" / "passwd").write_text(PASSWD)
    (tmp_path / "etc" / "group").write_text(GROUP)
    return Image("img", tmp_path, config.pop("env", {}), config.pop("workdir", ""), user,
                 **config)  # fmt: skip


def test_the_runtimes_pods_run_as_1000_with_fsgroup_and_the_images_groups(tmp_path) -> None:
    # gpt is listed in /etc/group's video and app: containerd adds them (Merge, the default).
    assert image(tmp_path).identity(RUNTIME_POD, {}) == (1000, 1000, [44, 1000, 1001])
    strict = {"securityContext": {**RUNTIME_POD["securityContext"],
                                  "supplementalGroupsPolicy": "Strict"}}  # fmt: skip
    assert image(tmp_path).identity(strict, {}) == (1000, 1000, [1000])


def test_a_uid_alone_takes_its_group_from_the_images_passwd_not_from_its_user(tmp_path) -> None:
    # The kubelet hands the runtime the image's uid only: the USER's group is not used.
    assert image(tmp_path, "1001:1000").own_identity() == (1001, 1001, [44, 1001])
    assert image(tmp_path, "4242:1000").own_identity() == (4242, 0, [0])
    for run_as_user, group in [(1001, 1001), (7, 0)]:
        pod = {"securityContext": {"runAsUser": run_as_user}}
        assert image(tmp_path).identity(pod, {})[:2] == (run_as_user, group)


def test_a_user_name_resolves_in_the_images_passwd_or_the_container_is_refused(tmp_path) -> None:
    assert image(tmp_path, "app").own_identity() == (1001, 1001, [44, 1001])
    assert image(tmp_path, "app:video").own_identity() == (1001, 1001, [44, 1001])
    assert image(tmp_path, "app").identity({"securityContext": {"runAsGroup": 7}}, {})[:2] == (
        1001, 7)
    with pytest.raises(CreateContainerError, match="no users found") as refused:
        image(tmp_path, "nobody-here").own_identity()
    assert refused.value.reason == "CreateContainerError"


def test_run_as_non_root_refuses_root_and_a_user_name(tmp_path) -> None:
    non_root = {"securityContext": {"runAsNonRoot": True}}
    with pytest.raises(CreateContainerError, match="image will run as root") as refused:
        image(tmp_path, "").identity(non_root, {})
    assert refused.value.reason == "CreateContainerConfigError"
    with pytest.raises(CreateContainerError, match=r"non-numeric user \(app\)"):
        image(tmp_path, "app").identity(non_root, {})
    with pytest.raises(CreateContainerError, match="runAsUser breaks non-root policy"):
        image(tmp_path).identity(non_root, {"securityContext": {"runAsUser": 0}})
    # The container's field wins over the pod's.
    container = {"securityContext": {"runAsUser": 1001}}
    assert image(tmp_path).identity(RUNTIME_POD, container)[0] == 1001


def test_argv_is_the_command_else_the_images_entrypoint_and_cmd(tmp_path) -> None:
    img = image(tmp_path, entrypoint=("python",), cmd=("-m", "gpt", "--help"))
    assert img.argv({"command": ["torchrun"], "args": ["-x"]}) == ["torchrun", "-x"]
    assert img.argv({"command": ["torchrun"]}) == ["torchrun"]  # no Cmd with a command
    assert img.argv({"args": ["-c", "1"]}) == ["python", "-c", "1"]
    assert img.argv({}) == ["python", "-m", "gpt", "--help"]
    with pytest.raises(CreateContainerError, match="no command specified"):
        image(tmp_path).argv({})


def test_env_is_the_default_path_then_the_images_then_the_containers(tmp_path) -> None:
    img = image(tmp_path, env={"LANG": "C.UTF-8", "HOME": "/img"})
    assert img.environment({}, 1000) == {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": "/img"}
    env = img.environment({"LANG": "x", "PATH": "/p", "HOME": ""}, 1000)
    # An empty HOME is replaced by the user's home from /etc/passwd, as runc does.
    assert env == {"PATH": "/p", "LANG": "x", "HOME": "/home/gpt"}
    assert image(tmp_path).environment({}, 4242)["HOME"] == "/"


def test_fsgroup_on_root_mismatch_skips_only_a_root_with_group_rwx_and_setgid(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another group needs root")
    volume = tmp_path / "volume"
    (volume / "run").mkdir(parents=True)
    (volume / "run" / "f").write_text("x")
    os.chown(volume, -1, 1000)
    volume.chmod(0o755)  # the group already, but no g+w nor setgid: still changed
    set_volume_ownership(volume, 1000, "OnRootMismatch")
    assert (volume / "run" / "f").stat().st_gid == 1000
    assert volume.stat().st_mode & 0o2070 == 0o2070
    os.chown(volume / "run" / "f", -1, 0)
    set_volume_ownership(volume, 1000, "OnRootMismatch")  # the root matches now: skipped
    assert (volume / "run" / "f").stat().st_gid == 0
    set_volume_ownership(volume, 1000, None)  # unset (Always): every start
    assert (volume / "run" / "f").stat().st_gid == 1000


@pytest.mark.process
def test_the_container_makes_its_working_directory_and_a_missing_program_exits_128(
        tmp_path) -> None:  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("container.py needs root (mount and PID namespaces)")
    host = Image("host", Path("/"), {}, "", "0:0")  # this machine's root as the image's
    cwd = tmp_path / "made" / "here"

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ["PATH"]}
        command = container_command(host, tmp_path / "spec.json", argv, env, {}, (0, 0, [0]),
                                    str(cwd))  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    done = run(["pwd"])
    assert (done.returncode, done.stdout.strip()) == (0, str(cwd)), done.stderr
    assert cwd.stat().st_mode & 0o777 == 0o755
    assert run(["no-such-program-here"]).returncode == 128
