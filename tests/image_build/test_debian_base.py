"""docker/debian-base.sh, the stand-in base image: its exit status says whether it made the image
(0) or which step failed (one line, non-zero), whatever its cleanup does, and it leaves no
container or scratch folder behind. Its Buildah steps run for real, on a tiny root filesystem
that a stand-in `mmdebstrap` on PATH writes (the real one takes two minutes and the network;
`make test-images` runs it on a new machine, see .ci/run), in a Buildah storage of the test's
own: other tests' working containers in the machine's storage come and go meanwhile."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import PROJECT

SCRIPT = PROJECT / "docker" / "debian-base.sh"

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(os.geteuid() != 0, reason="Buildah builds here as root"),
    pytest.mark.skipif(shutil.which("buildah") is None,
                       reason="buildah is not installed (apt-get install buildah)"),  # fmt: skip
]

# mmdebstrap's last argument is the tarball to write: this one writes a root filesystem of one
# file, or fails with status 3 when FAKE_MMDEBSTRAP_FAIL is set, as a mirror out of reach would.
FAKE_MMDEBSTRAP = """#!/usr/bin/env python3
import os, sys, tarfile
if os.environ.get("FAKE_MMDEBSTRAP_FAIL"):
    sys.exit(3)
with tarfile.open(sys.argv[-1], "w") as tar:
    tar.add(os.environ["FAKE_ROOTFS_FILE"], arcname="etc/os-release")
"""


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """The script's environment: the stand-in mmdebstrap first on PATH, a scratch TMPDIR to find
    leftovers in, and a Buildah storage of its own (vfs: plain folders, no mounts to outlive it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(FAKE_MMDEBSTRAP)
    (bin_dir / "mmdebstrap").chmod(0o755)
    (tmp_path / "os-release").write_text('PRETTY_NAME="a tiny stand-in"\n')
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    storage = tmp_path / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/graph"\n'
                       f'runroot = "{tmp_path}/run"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(scratch),
           "FAKE_ROOTFS_FILE": str(tmp_path / "os-release"),
           "CONTAINERS_STORAGE_CONF": str(storage)}  # fmt: skip
    yield env
    buildah(env, "rm", "--all")
    buildah(env, "rmi", "--all", "--force")


IMAGE = "localhost/gpt-test-debian-base:t"


def buildah(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], env=env, capture_output=True, text=True)


def run_script(image: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), image, "buildah"], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def image_exists(image: str, env: dict[str, str]) -> bool:
    return buildah(env, "inspect", "--type", "image", image).returncode == 0


def containers(env: dict[str, str]) -> list[str]:
    listed = buildah(env, "containers", "--quiet", "--all")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def test_a_made_image_exits_0_and_leaves_nothing_behind(fake_env):
    made = run_script(IMAGE, fake_env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == f"debian-base.sh: made {IMAGE}"
    assert image_exists(IMAGE, fake_env)
    assert containers(fake_env) == []  # committed with --rm: gone, and cleanup's rm found none
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []
    # The image holds the tarball's root filesystem and the config the Dockerfiles assume.
    config = buildah(fake_env, "inspect", "--type", "image", "--format",
                     "{{.OCIv1.Config.Cmd}} {{.OCIv1.Config.Env}}", IMAGE).stdout
    assert "python3" in config and "/usr/local/bin" in config
    ctr = buildah(fake_env, "from", IMAGE).stdout.strip()
    mount = buildah(fake_env, "mount", ctr).stdout.strip()
    assert (Path(mount) / "etc/os-release").read_text() == 'PRETTY_NAME="a tiny stand-in"\n'
    assert buildah(fake_env, "rm", ctr).returncode == 0

    again = run_script(IMAGE, fake_env)
    assert again.returncode == 0, again.stderr
    assert "exists; keeping it" in again.stdout


def test_a_failed_step_is_one_line_naming_it_and_its_status(fake_env):
    failed = run_script(IMAGE, {**fake_env, "FAKE_MMDEBSTRAP_FAIL": "1"})
    assert failed.returncode == 3
    assert failed.stderr.strip() == (f"debian-base.sh: error: mmdebstrap failed (exit status 3); "
                                     f"{IMAGE} was not made")  # fmt: skip
    assert not image_exists(IMAGE, fake_env)
    assert containers(fake_env) == []
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []


def test_a_failed_buildah_step_removes_its_container(fake_env):
    bad_name = "localhost/Not A Valid Name:t"  # buildah commit refuses it, after from and add
    failed = run_script(bad_name, fake_env)
    assert failed.returncode != 0
    assert failed.stderr.strip().splitlines()[-1].startswith(
        "debian-base.sh: error: buildah commit failed (exit status")
    assert containers(fake_env) == []  # the uncommitted container was removed on the way out
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []
