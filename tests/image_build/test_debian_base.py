"""docker/debian-base.sh, the stand-in base image: its exit status says whether it made the image
(0) or which step failed (one line, non-zero), whatever its cleanup does, and it leaves no
container or scratch folder behind. Its Buildah steps run for real, on a tiny root filesystem
that a stand-in `mmdebstrap` on PATH writes (the real one takes two minutes and the network;
`make test-images` runs it on a new machine, see .ci/run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from support.paths import PROJECT

SCRIPT = PROJECT / "docker" / "debian-base.sh"

pytestmark = [
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
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(FAKE_MMDEBSTRAP)
    (bin_dir / "mmdebstrap").chmod(0o755)
    (tmp_path / "os-release").write_text('PRETTY_NAME="a tiny stand-in"\n')
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(scratch),
            "FAKE_ROOTFS_FILE": str(tmp_path / "os-release")}  # fmt: skip


@pytest.fixture
def image_name():
    name = f"localhost/gpt-test-debian-base-{uuid.uuid4().hex[:12]}:t"
    yield name
    subprocess.run(["buildah", "rmi", "-f", name], capture_output=True)


def run_script(image: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), image, "buildah"], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def image_exists(image: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", image],
                          capture_output=True).returncode == 0  # fmt: skip


def containers() -> set[str]:
    out = subprocess.run(["buildah", "containers", "--quiet", "--all"], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return set(out.split())


def test_a_made_image_exits_0_and_leaves_nothing_behind(fake_env, image_name):
    before = containers()
    made = run_script(image_name, fake_env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[-1] == f"debian-base.sh: made {image_name}"
    assert image_exists(image_name)
    assert containers() == before  # committed with --rm: gone, and cleanup's rm found none
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []
    # The image holds the tarball's root filesystem and the config the Dockerfiles assume.
    config = subprocess.run(["buildah", "inspect", "--type", "image", "--format",
                             "{{.OCIv1.Config.Cmd}} {{.OCIv1.Config.Env}}", image_name],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "python3" in config and "/usr/local/bin" in config
    ctr = subprocess.run(["buildah", "from", image_name], check=True, capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    try:
        mount = subprocess.run(["buildah", "mount", ctr], check=True, capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
        assert (Path(mount) / "etc/os-release").read_text() == 'PRETTY_NAME="a tiny stand-in"\n'
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)

    again = run_script(image_name, fake_env)
    assert again.returncode == 0, again.stderr
    assert "exists; keeping it" in again.stdout


def test_a_failed_step_is_one_line_naming_it_and_its_status(fake_env, image_name):
    before = containers()
    failed = run_script(image_name, {**fake_env, "FAKE_MMDEBSTRAP_FAIL": "1"})
    assert failed.returncode == 3
    assert failed.stderr.strip() == (f"debian-base.sh: error: mmdebstrap failed (exit status 3); "
                                     f"{image_name} was not made")  # fmt: skip
    assert not image_exists(image_name)
    assert containers() == before
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []


def test_a_failed_buildah_step_removes_its_container(fake_env):
    before = containers()
    bad_name = "localhost/Not A Valid Name:t"  # buildah commit refuses it, after from and add
    failed = run_script(bad_name, fake_env)
    assert failed.returncode != 0
    assert failed.stderr.strip().splitlines()[-1].startswith(
        "debian-base.sh: error: buildah commit failed (exit status")
    assert containers() == before  # the uncommitted container was removed on the way out
    assert list(Path(fake_env["TMPDIR"]).iterdir()) == []

