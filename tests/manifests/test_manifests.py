"""manifests/: valid against the Kubernetes schemas; the Role grants just what the code uses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from support.paths import PROJECT

MANIFESTS = PROJECT / "manifests"
# The oldest Kubernetes the project supports (Kubeflow Trainer v2.x needs 1.31+) and the newest
# schema kubernetes-validate ships.
VERSIONS = ["1.31.0", kubernetes_validate.utils.latest_version()]


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def core_objects() -> list[tuple[str, dict]]:
    """Objects of Kubernetes' own kinds (KServe's InferenceService is checked against its CRD on
    the test API server instead: tests/manifests/test_kserve.py)."""
    objs = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            rel = path.relative_to(MANIFESTS)
            objs += [(f"{rel}:{d['kind']}", d) for d in documents(path)
                     if not d["apiVersion"].startswith("serving.kserve.io/")]  # fmt: skip
    return objs


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,obj", core_objects(), ids=[n for n, _ in core_objects()])
def test_manifest_is_valid_against_the_kubernetes_schema(name, obj, version):
    # strict: an unknown (misspelt) field is an error, as kubectl's server-side validation makes it
    kubernetes_validate.validate(obj, version, strict=True)


def test_every_manifest_opens_with_what_it_is_and_how_to_apply_check_clean_up():
    for path in sorted([*MANIFESTS.rglob("*.yaml"), *(PROJECT / "runtimes").glob("*.yaml")]):
        head = path.read_text().split("\napiVersion:")[0]
        assert head.startswith("# "), f"{path}: no opening comment"
        for word in ("Apply:", "Check:", "Clean up:"):
            assert word in head, f"{path}: its opening comment lacks {word!r}"


def kustomization(mode: str) -> dict:
    return yaml.safe_load((MANIFESTS / mode / "kustomization.yaml").read_text())


def test_each_mode_places_the_claim_in_the_steps_namespace():
    assert kustomization("base")["resources"] == ["pvc.yaml"]
    # Standalone KFP: steps in `kubeflow` as pipeline-runner, which needs the Role.
    standalone = kustomization("standalone")
    assert standalone["namespace"] == "kubeflow"
    assert standalone["resources"] == ["../base", "rbac.yaml"]
    # Multi-user Kubeflow: `kubectl -n <profile> apply -k`; default-editor needs no binding.
    profile = kustomization("profile")
    assert "namespace" not in profile and profile["resources"] == ["../base"]
    (pvc,) = documents(MANIFESTS / "base" / "pvc.yaml")
    assert "namespace" not in pvc["metadata"], "the mode decides where the claim lives"
    assert not any(d["kind"] == "Namespace" for _, d in core_objects()), "no namespace of ours"


@pytest.mark.process
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (its built-in kustomize)")
def test_kustomize_builds_each_mode():
    def built(mode: str) -> list[tuple[str, str, str | None]]:
        out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / mode)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
                      for d in yaml.safe_load_all(out) if d)  # fmt: skip

    assert built("standalone") == [
        ("PersistentVolumeClaim", "gpt-pvc", "kubeflow"),
        ("Role", "gpt-trainjob-launcher", "kubeflow"),
        ("RoleBinding", "gpt-trainjob-launcher", "kubeflow"),
    ]
    assert built("profile") == [("PersistentVolumeClaim", "gpt-pvc", None)]


def test_pvc_documents_rwo_and_when_rwx_is_needed():
    text = (MANIFESTS / "base" / "pvc.yaml").read_text()
    (pvc,) = documents(MANIFESTS / "base" / "pvc.yaml")
    assert pvc["metadata"]["name"] == "gpt-pvc"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "ReadWriteMany" in text and "numNodes > 1" in text


@pytest.mark.process
def test_yamllint_passes_on_the_manifests() -> None:
    yamllint = Path(sys.executable).parent / "yamllint"  # the venv's
    result = subprocess.run([str(yamllint), "--strict", "runtimes", "manifests"],
                            capture_output=True, text=True, cwd=PROJECT)
    assert result.returncode == 0, result.stdout + result.stderr
