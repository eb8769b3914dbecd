"""The Makefile's image targets (`make build-images`, `push-images`, `wheelhouse`), checked with
`make -n` and fake container tools on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.images_env import DOCKER, pyproject, requirements
from support.paths import PROJECT


def fake_engine(tmp_path: Path, info_exit: int) -> tuple[dict, Path]:
    """A `fakedocker` on PATH that logs its calls; `info` exits with info_exit."""
    log = tmp_path / "calls.log"
    tool = tmp_path / "bin" / "fakedocker"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" != info ] || exit {info_exit}\n')
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ['PATH']}"}, log


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], capture_output=True,
                          text=True, cwd=PROJECT, env=env)


@pytest.mark.process
@pytest.mark.parametrize("target", ["build-images", "push-images"])
def test_make_says_in_one_line_when_no_container_tool_is_installed(target: str) -> None:
    result = make(target, "CONTAINER_TOOL=/nonexistent/docker")
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "/nonexistent/docker not found" in result.stderr and "Podman" in result.stderr


@pytest.mark.process
@pytest.mark.parametrize("target", ["build-images", "push-images"])
def test_make_says_in_one_line_when_no_engine_runs(target: str, tmp_path: Path) -> None:
    env, log = fake_engine(tmp_path, info_exit=1)
    result = make(target, "CONTAINER_TOOL=fakedocker", env=env)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no engine answers" in result.stderr
    assert log.read_text().split("\n")[:-1] == ["info"], "it went on past the failed check"


@pytest.mark.process
def test_make_build_and_push_use_the_images_py_names_for_any_registry(tmp_path: Path) -> None:
    env, _ = fake_engine(tmp_path, info_exit=0)
    override = {"IMAGE_REGISTRY": "registry.example.com:5000/me", "IMAGE_TAG": "v7"}
    cli = [f"{k}={v}" for k, v in override.items()]
    env["PYTHONPATH"] = str(PROJECT)
    names = subprocess.run(
        [sys.executable, "-c", "from components.step.image_names import *; "
         "print(workload_image(), component_image())"],
        capture_output=True, text=True, check=True, env={**env, **override}, cwd=tmp_path,
    ).stdout.split()
    workload, component = names
    cuda = "https://download.pytorch.org/whl/cu128"
    build = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", f"TORCH_INDEX_URL={cuda}",
                 *cli, env=env)
    assert build.returncode == 0, build.stderr
    commands = build.stdout.replace("\\\n", " ")
    for dockerfile, image in (("workload", workload), ("component", component)):
        build_line = rf"fakedocker build --file docker/{dockerfile}.Dockerfile (.*)--tag (\S+) \."
        flags, tag = re.search(build_line, commands).groups()
        assert tag == image
        assert ("--build-arg TORCH_INDEX_URL=" + cuda in flags) == (dockerfile == "workload")
    # ... then re-points the runtimes and recompiles the pipeline, with the same names (exported).
    assert "make --no-print-directory set-images compile" in commands
    assert f"docker/set_image.py runtimes/kustomization.yaml gpt-workload={workload}" in commands
    push = make("-n", "push-images", "CONTAINER_TOOL=fakedocker", *cli, env=env)
    assert push.stdout.splitlines() == [f"fakedocker push {image}" for image in names]


@pytest.mark.process
def test_make_without_overrides_uses_images_env(tmp_path: Path, default_images) -> None:
    env, _ = fake_engine(tmp_path, info_exit=0)
    for var in ("IMAGE_REGISTRY", "IMAGE_TAG"):
        env.pop(var, None)
    push = make("-n", "push-images", "CONTAINER_TOOL=fakedocker", env=env)
    assert [line.split()[-1] for line in push.stdout.splitlines()] == list(default_images)



def fake_tools(tmp_path: Path, **info_exits: int) -> dict:
    """Fake container tools on PATH, each logging its calls; `info` exits as given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, code in info_exits.items():
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\n[ "$1" != info ] || exit {code}\n')
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def build_lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """Dockerfile name -> the build command `make -n build-images` printed for it."""
    commands = " ".join(result.stdout.replace("\\\n", " ").split(" "))
    line = re.compile(r"\S+ build --file docker/(\w+)\.Dockerfile.*")
    return {m.group(1): " ".join(m.group(0).split()) for m in line.finditer(commands)}


@pytest.mark.process
def test_make_builds_with_the_first_tool_that_can_build_here(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=1, fakepodman=0, fakebuildah=0)
    build = make("-n", "build-images", "CONTAINER_TOOLS=fakedocker fakepodman fakebuildah", env=env)
    assert build.returncode == 0, build.stderr
    lines = build_lines(build)
    assert set(lines) == {"workload", "component"}
    assert all(line.startswith("fakepodman build ") for line in lines.values()), lines
    # Named, it wins over the first that answers.
    named = make("-n", "build-images", "CONTAINER_TOOLS=fakedocker fakepodman fakebuildah",
                 "CONTAINER_TOOL=fakebuildah", env=env)  # fmt: skip
    assert all(line.startswith("fakebuildah build ") for line in build_lines(named).values())


@pytest.mark.process
def test_make_says_in_one_line_when_no_tool_can_build_here(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=1, fakepodman=1)
    result = make("build-images", "CONTAINER_TOOLS=fakedocker fakepodman", env=env)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no container tool can build here" in result.stderr and "buildah" in result.stderr


@pytest.mark.process
def test_make_builds_from_a_wheelhouse_on_a_base_image_asking_no_index(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    empty = make("build-images", "CONTAINER_TOOL=fakedocker", f"WHEELHOUSE={wheels}", env=env)
    assert empty.returncode != 0 and empty.stderr.strip().count("\n") == 0, empty.stderr
    assert f"WHEELHOUSE={wheels} has no wheels" in empty.stderr
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    mirror = "mirror.example.com/library/python:3.11.14-slim-bookworm"
    build = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", f"WHEELHOUSE={wheels}",
                 f"BASE_IMAGE={mirror}", env=env)  # fmt: skip
    for line in build_lines(build).values():
        assert f"--build-context wheelhouse={wheels} --build-arg PIP_NO_INDEX=true" in line, line
        assert f"--build-arg BASE_IMAGE={mirror}" in line
    plain = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", env=env)
    for line in build_lines(plain).values():
        assert "wheelhouse" not in line and "PIP_NO_INDEX" not in line and "BASE_IMAGE" not in line


@pytest.mark.process
def test_make_wheelhouse_fills_the_folder_with_what_both_images_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    dry = make("-n", "wheelhouse", f"WHEELHOUSE={wheels}", "TORCH_INDEX_URL=")
    assert dry.returncode == 0, dry.stderr
    commands = " ".join(dry.stdout.replace("\\\n", " ").split())
    # The core dependencies, the extras the images install, and the build backend.
    installed = {m for d in DOCKER.glob("*.Dockerfile")
                 for m in re.findall(r"requirements\.py pyproject\.toml ?([\w-]*)", d.read_text())}
    listed = re.search(r"for extra in (.*?); do", commands)[1].split()
    assert {e.strip("'") for e in listed} == installed | {"build-system"}, listed
    assert f"-m pip wheel --wheel-dir {wheels} --requirement {wheels}/requirements.txt" in commands
    assert "--extra-index-url" not in commands  # TORCH_INDEX_URL empty: pip's own config
    toml = str(PROJECT / "pyproject.toml")
    assert requirements(toml, "build-system") == pyproject()["build-system"]["requires"]
    assert requirements(toml, "") == pyproject()["project"]["dependencies"]
    missing = make("wheelhouse")
    assert missing.returncode != 0 and "WHEELHOUSE=DIR" in missing.stderr
