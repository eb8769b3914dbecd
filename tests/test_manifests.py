"""manifests/: valid against the Kubernetes schemas; the Role grants just what the code uses."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

PROJECT = Path(__file__).resolve().parent.parent
MANIFESTS = PROJECT / "manifests"
# The oldest Kubernetes the project supports (Kubeflow Trainer v2.x needs 1.31+) and the newest
# schema kubernetes-validate ships.
VERSIONS = ["1.31.0", kubernetes_validate.utils.latest_version()]


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def core_objects() -> list[tuple[str, dict]]:
    objs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            objs += [(f"{path.name}:{d['kind']}", d) for d in documents(path)]
    return objs


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,obj", core_objects(), ids=[n for n, _ in core_objects()])
def test_manifest_is_valid_against_the_kubernetes_schema(name, obj, version):
    # strict: an unknown (misspelt) field is an error, as kubectl's server-side validation makes it
    kubernetes_validate.validate(obj, version, strict=True)


def test_every_manifest_opens_with_what_it_is_and_how_to_apply_check_clean_up():
    for path in sorted([*MANIFESTS.glob("*.yaml"), *(PROJECT / "runtimes").glob("*.yaml")]):
        head = path.read_text().split("\napiVersion:")[0]
        assert head.startswith("# "), f"{path.name}: no opening comment"
        for word in ("Apply:", "Check:", "Clean up:"):
            assert word in head, f"{path.name}: its opening comment lacks {word!r}"


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    assert listed == {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert "namespace" not in kust, "a namespace transformer would re-home the RoleBinding subject"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (its built-in kustomize)")
def test_kustomize_builds_the_namespace_pvc_and_rbac():
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True,
                         check=True).stdout
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d)
    assert kinds == [
        ("Namespace", "training"),
        ("PersistentVolumeClaim", "gpt-pvc"),
        ("Role", "gpt-trainjob-launcher"),
        ("RoleBinding", "gpt-trainjob-launcher"),
    ]


def rbac() -> tuple[dict, dict]:
    role, binding = documents(MANIFESTS / "rbac.yaml")
    return role, binding


def test_role_grants_exactly_the_launchers_needs_to_pipeline_runner():
    role, binding = rbac()
    grants = {
        (g, r): sorted(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants == {
        ("trainer.kubeflow.org", "trainjobs"): ["create", "delete", "get", "list", "watch"],
        ("", "pods"): ["get", "list"],
        ("", "pods/log"): ["get"],
    }
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "training"
    assert binding["metadata"]["namespace"] == "training"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}
    ]


def test_the_launcher_calls_no_api_the_role_does_not_grant():
    # Every Kubernetes API method components/launcher.py calls, mapped to what it needs.
    needs = {
        "create_namespaced_custom_object": ("trainjobs", "create"),
        "list_namespaced_custom_object": ("trainjobs", "list"),  # and watch, via Watch.stream
        "get_namespaced_custom_object": ("trainjobs", "get"),
        "delete_namespaced_custom_object": ("trainjobs", "delete"),
        "list_namespaced_pod": ("pods", "list"),
        "read_namespaced_pod_log": ("pods/log", "get"),
    }
    tree = ast.parse((PROJECT / "components" / "launcher.py").read_text())
    called = {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr.endswith(("_object", "_pod", "_pod_log"))
    }  # fmt: skip
    assert called <= set(needs), f"unmapped API calls: {called - set(needs)}"
    role, _ = rbac()
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {needs[c] for c in called} | {("trainjobs", "watch")} <= granted


def test_pvc_documents_rwo_and_when_rwx_is_needed():
    text = (MANIFESTS / "pvc.yaml").read_text()
    (pvc,) = documents(MANIFESTS / "pvc.yaml")
    assert pvc["metadata"] == {
        "name": "gpt-pvc", "namespace": "training", "labels": pvc["metadata"]["labels"]
    }  # fmt: skip
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "ReadWriteMany" in text and "numNodes > 1" in text
