"""The images built here, once a session, as `make build-images` builds them for a user: only
under `make test-images` (GPT_TEST_IMAGES=1), never in `make test`; skipped, with the reason,
where they cannot be built (not root, no Buildah or mmdebstrap).

Docker Hub may be out of reach (it is on the CI machine): then the images are built on a
stand-in for the official Python base, docker/debian-base.sh's, made from Debian's packages,
and the test says so. Their Python packages come from a wheelhouse (`make wheelhouse`, with this
machine's pip and so its local torch CPU wheel) through `make build-images WHEELHOUSE=DIR`, the
air-gapped path. Layers, the stand-in base and the wheelhouse stay on the machine (Buildah's
storage, GPT_IMAGES_CACHE) for the next run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cluster.images import Image, mounted

from components.step import image_names as images

if os.environ.get("GPT_TEST_IMAGES") != "1":
    collect_ignore_glob = ["test_*.py"]  # `make test` leaves the images to `make test-images`

PROJECT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("GPT_IMAGES_CACHE", "/var/cache/gpt-trainjobs"))
OFFICIAL_BASE = "docker.io/library/python:3.11.14-slim-bookworm"
STAND_IN_BASE = "localhost/gpt-trainjobs-base:bookworm"
BUILDAH = "buildah"


@dataclass(frozen=True)
class Built:
    """What `make build-images` made: the images (named as images.env names them) and the
    checkout it ran in, whose pipeline it recompiled."""

    workload: str
    component: str
    base: str
    stand_in: bool
    """The base is docker/debian-base.sh's, the official one being out of reach."""
    checkout: Path
    log: str
    seconds: float


def why_not_built() -> str | None:
    if os.geteuid() != 0:
        return "building and running images needs root (Buildah with chroot isolation)"
    if shutil.which(BUILDAH) is None:
        return "buildah is not installed (apt-get install buildah mmdebstrap)"
    return None


def say(config: pytest.Config, text: str) -> None:
    """A line in pytest's own output, captured or not: what the run built on and measured."""
    with config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        config.pluginmanager.get_plugin("terminalreporter").write_line(f"\nimages: {text}")


@pytest.fixture
def report(pytestconfig):
    """say() for a test."""
    return lambda text: say(pytestconfig, text)


def base_image(config: pytest.Config) -> str:
    """The official base where it can be pulled, else the Debian stand-in (made once)."""
    try:
        pulled = subprocess.run([BUILDAH, "pull", "--quiet", OFFICIAL_BASE], capture_output=True,
                                timeout=120).returncode == 0  # fmt: skip
    except subprocess.TimeoutExpired:
        pulled = False
    if pulled:
        return OFFICIAL_BASE
    if shutil.which("mmdebstrap") is None:
        pytest.skip(f"{OFFICIAL_BASE} cannot be pulled and mmdebstrap is not installed for the "
                    "stand-in base (apt-get install mmdebstrap)")  # fmt: skip
    say(config, f"{OFFICIAL_BASE} cannot be pulled here; building on the stand-in "
                f"{STAND_IN_BASE}, Debian bookworm's python3 (docker/debian-base.sh)")
    subprocess.run([str(PROJECT / "docker" / "debian-base.sh"), STAND_IN_BASE, BUILDAH],
                   check=True)  # fmt: skip
    return STAND_IN_BASE


def wheelhouse() -> Path:
    """`make wheelhouse` into the cache, again only when the requirements changed."""
    folder = CACHE / "wheelhouse"
    wanted = subprocess.run(
        ["bash", "-c", "for e in '' serve storage pipeline build-system; do "
         "python3 docker/requirements.py pyproject.toml $e; done"],
        cwd=PROJECT, check=True, capture_output=True, text=True).stdout  # fmt: skip
    done = folder / ".complete"
    if not (done.exists() and done.read_text() == wanted):
        subprocess.run(["make", "--no-print-directory", "wheelhouse", f"WHEELHOUSE={folder}",
                        "TORCH_INDEX_URL="], cwd=PROJECT, check=True)  # fmt: skip
        done.write_text(wanted)
    return folder


def checkout_copy(dest: Path) -> Path:
    """This checkout's files (tracked and untracked, not ignored), so that `make build-images`
    recompiles the pipeline there and not here. Every file and folder dated 1970: Buildah's
    layer cache keys a COPY on its files' metadata too, and a fresh clone's dates are new, so
    the layers are reused across clones only when the dates are fixed; and pyproject.toml older
    than this venv's stamp, so make uses the venv as it is."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=PROJECT, check=True, capture_output=True).stdout  # fmt: skip
    files = listed.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (PROJECT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / name, dest / name)
    for path in [*dest.rglob("*"), dest]:
        os.utime(path, (0, 0), follow_symlinks=False)
    return dest


@pytest.fixture(scope="session")
def built(tmp_path_factory, pytestconfig) -> Built:
    if reason := why_not_built():
        pytest.skip(reason)
    base, wheels = base_image(pytestconfig), wheelhouse()
    checkout = checkout_copy(tmp_path_factory.mktemp("checkout"))
    venv = Path(sys.executable).parent.parent
    start = time.monotonic()
    result = subprocess.run(
        ["make", "--no-print-directory", "build-images", f"CONTAINER_TOOL={BUILDAH}",
         f"BASE_IMAGE={base}", f"WHEELHOUSE={wheels}", f"VENV={venv}"],
        cwd=checkout, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - start
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    say(pytestconfig, f"make build-images took {seconds:.0f} s")
    return Built(images.workload_image(), images.component_image(), base,
                 base == STAND_IN_BASE, checkout, log, seconds)  # fmt: skip


@pytest.fixture(scope="session")
def image_rootfs(built) -> Iterator[dict[str, Image]]:
    """Both images' root filesystems, mounted for the session."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(mounted(name, BUILDAH))
               for name in (built.workload, built.component)}  # fmt: skip


@pytest.fixture
def run_images(image_rootfs) -> dict[str, Image]:
    """The test cluster's kubelet runs every container in its built image."""
    return image_rootfs
