"""Container image names from their one source, images.env (components/step/image_names.py): every
image reference the project ships agrees with it: the runtimes and their kustomization, the
components' base_image, the compiled pipeline and the README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from support.images_env import IMAGE_REF, workload_entry
from support.paths import PROJECT

from components.step import image_names as images


def test_runtimes_name_the_images_env_image_and_kustomize_repoints_them(default_images) -> None:
    workload, _ = default_images
    found = []
    for path in sorted((PROJECT / "runtimes").glob("gpt-*.yaml")):
        found += re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M)
    assert len(found) >= 3, "expected an image in each of the three runtimes"
    assert set(found) == {workload}, f"runtimes name {set(found)}, images.env says {workload}"
    # ... and kustomize rewrites that name to wherever `make set-images` points.
    assert workload_entry()["name"] == workload.rpartition(":")[0]


def test_kustomization_points_at_the_workload_image() -> None:
    # What `make set-images` writes: images.env, or the environment as make exports it.
    entry = workload_entry()
    assert f"{entry['newName']}:{entry['newTag']}" == images.workload_image(), (
        "runtimes/kustomization.yaml disagrees with images.env: run make set-images"
    )


def compiled_pipelines() -> list[Path]:
    paths = sorted((PROJECT / "pipeline").glob("*.yaml"))
    assert paths, "no compiled pipeline YAML in pipeline/ (make compile writes it)"
    return paths


def test_compiled_pipeline_uses_the_images_and_the_pinned_kfp() -> None:
    import kfp

    for path in compiled_pipelines():
        text = path.read_text()
        refs = set(IMAGE_REF.findall(text))
        assert images.component_image() in refs, f"{path.name} never runs the component image"
        assert refs <= {images.component_image(), images.workload_image()}, (
            f"{path.name} names {refs}; images.env (and the environment) say "
            f"{images.component_image()} and {images.workload_image()}: run make compile"
        )
        executors = [
            d for doc in yaml.safe_load_all(text) if doc and "deploymentSpec" in doc
            for d in doc["deploymentSpec"]["executors"].values()
        ]
        assert executors
        assert {e["container"]["image"] for e in executors} == {images.component_image()}
        assert re.search(rf"sdkVersion: kfp-{re.escape(kfp.__version__)}\b", text)


@pytest.mark.process
def test_components_base_image_follows_the_environment_at_compile_time() -> None:
    # The components read the names when imported, i.e. when the pipeline compiles: compiling
    # under `make ... IMAGE_REGISTRY=... IMAGE_TAG=...` re-points every step.
    probe = textwrap.dedent("""
        import importlib, pkgutil, components
        from kfp.dsl.base_component import BaseComponent
        for m in pkgutil.iter_modules(components.__path__):
            for name, obj in vars(importlib.import_module("components." + m.name)).items():
                if isinstance(obj, BaseComponent) and obj.component_spec.implementation.container:
                    print(name, obj.component_spec.implementation.container.image)
    """)
    env = {**os.environ, "IMAGE_REGISTRY": "registry.example.com/probe", "IMAGE_TAG": "t42"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=PROJECT, env=env, check=True).stdout.split("\n")
    found = dict(line.split() for line in out if line)
    assert len(found) >= 3, f"expected a component per stage in components/, found {found}"
    assert set(found.values()) == {"registry.example.com/probe/gpt-component:t42"}, found


def test_docs_name_exactly_the_images_env_images(default_images) -> None:
    """The README and docs/ (the cluster guide names the images) agree with images.env."""
    docs = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
    refs = {r for doc in docs for r in IMAGE_REF.findall(doc.read_text()) if "$" not in r}
    assert refs == set(default_images), f"the docs name {refs}; images.env says {default_images}"
