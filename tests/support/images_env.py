"""What the tests of the images read: images.env's names, the Dockerfiles, docker/'s scripts and
pyproject.toml (tests/image_build/, tests/kfp_components/step/test_image_names.py)."""

from __future__ import annotations

import importlib.util
import re
import tomllib

import pytest
import yaml

from components.step import image_names as images
from support.paths import PROJECT

DOCKER = PROJECT / "docker"
WORKLOAD_DOCKERFILE = DOCKER / "workload.Dockerfile"
COMPONENT_DOCKERFILE = DOCKER / "component.Dockerfile"
# An image reference to one of our two images, as it appears in any text.
IMAGE_REF = re.compile(r"[\w.\-/:${}]*/gpt-(?:workload|component):[\w.\-${}]+")


def docker_script(name: str):
    """A script of docker/ as a module, without putting docker/ on sys.path for every test."""
    spec = importlib.util.spec_from_file_location(f"docker_{name}", DOCKER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


requirements = docker_script("requirements").requirements
set_image = docker_script("set_image").set_image


def pyproject() -> dict:
    return tomllib.loads((PROJECT / "pyproject.toml").read_text())


@pytest.fixture
def default_images(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(workload, component) as images.env names them, whatever the environment says."""
    monkeypatch.delenv("IMAGE_REGISTRY", raising=False)
    monkeypatch.delenv("IMAGE_TAG", raising=False)
    return images.workload_image(), images.component_image()


def workload_entry() -> dict:
    """The runtimes' kustomization `images:` entry for the workload image."""
    kustomization = yaml.safe_load((PROJECT / "runtimes" / "kustomization.yaml").read_text())
    entries = [e for e in kustomization.get("images", [])
               if e["name"] == "gpt-workload" or e["name"].endswith("/gpt-workload")]
    assert len(entries) == 1, "runtimes/kustomization.yaml needs one images: entry for gpt-workload"
    return entries[0]
