"""What the steps call on the Kubernetes API equals what each way of running KFP grants them.

The calls are read from components/ itself (every `<verb>_namespaced_<kind>` call of the
kubernetes client, a custom object's resource the `GROUP` and `PLURAL` its module names;
`Watch.stream` over a list call, which the API server authorises as `watch`; and
`server_side_apply`, a `patch`), so a new call the grants lack fails here, before a cluster
says 403.
- Standalone KFP: the steps run as `kubeflow:pipeline-runner`; manifests/standalone/rbac.yaml's
  Role must grant exactly those calls.
- Multi-user Kubeflow: the steps run as `<profile>:default-editor`, bound to `kubeflow-edit`;
  `KUBEFLOW_EDIT` below is what upstream aggregates into it, and must cover the calls.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml
from support.paths import PROJECT

CALL = re.compile(r"^(create|get|list|read|delete|patch|replace)_namespaced_(\w+)$")
# components/serving/inferenceservice.py's apply (PATCH, application/apply-patch+yaml)
APPLY = "server_side_apply"
# The kubernetes client's names for the core kinds components/ uses: (API group, resource).
RESOURCES = {
    "pod": ("", "pods"),
    "pod_log": ("", "pods/log"),
    "event": ("", "events"),
    "persistent_volume_claim": ("", "persistentvolumeclaims"),
}

# What `kubeflow-edit` grants in a profile namespace, from upstream:
# - kubeflow/trainer v2.3.0 manifests/overlays/kubeflow-platform/kubeflow-trainer-roles.yaml:
#   ClusterRole kubeflow-trainer-edit (label aggregate-to-kubeflow-edit): trainjobs create,
#   patch, get, list, watch, delete; pods, pods/log, events get, list, watch.
# - kubeflow/manifests v1.10.0 common/kubeflow-roles/base/cluster-roles.yaml: ClusterRole
#   kubeflow-kubernetes-view (aggregate-to-kubeflow-view; kubeflow-view aggregates into
#   kubeflow-edit): pods, persistentvolumeclaims, events, pods/log get, list, watch.
# - kubeflow/kubeflow components/profile-controller/controllers/profile_controller.go: each
#   profile namespace binds ServiceAccount default-editor to ClusterRole kubeflow-edit.
# - kubeflow/manifests v1.11.0 applications/kserve/kserve/aggregated-roles.yaml: ClusterRole
#   kubeflow-kserve-edit (aggregate-to-kubeflow-edit): inferenceservices get, list, watch,
#   create, delete, deletecollection, patch, update.
_READ = {"get", "list", "watch"}
KUBEFLOW_EDIT = {
    ("trainer.kubeflow.org", "trainjobs"): {"create", "patch", "delete"} | _READ,
    ("serving.kserve.io", "inferenceservices"): {"create", "delete", "deletecollection",
                                                 "patch", "update"} | _READ,
    ("", "pods"): _READ,
    ("", "pods/log"): _READ,
    ("", "events"): _READ,
    ("", "persistentvolumeclaims"): _READ,
}


def _constants(path: Path) -> dict[str, str]:
    """A module's GROUP and PLURAL: assigned there, or imported from the module that does."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("GROUP", "PLURAL"):
                    found[target.id] = node.value.value
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "components."):  # fmt: skip
            names = {a.name for a in node.names} & {"GROUP", "PLURAL"}
            if names:
                source = PROJECT / (node.module.replace(".", "/") + ".py")
                found.update({k: v for k, v in _constants(source).items() if k in names})
    return found


def calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every API call in components/."""
    found = set()
    paths = sorted((PROJECT / "components").rglob("*.py"))
    # server_side_apply's resource: its own module's
    (applied,) = [_constants(p) for p in paths if f"def {APPLY}(" in p.read_text()]
    for path in paths:
        consts = _constants(path)
        kinds = {**RESOURCES, "custom_object": (consts.get("GROUP"), consts.get("PLURAL"))}
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name == APPLY and isinstance(node.func, ast.Name):
                found.add((applied["GROUP"], applied["PLURAL"], "patch"))
            if not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "stream" and node.args and isinstance(node.args[0], ast.Attribute):
                m = CALL.match(node.args[0].attr)
                if m and m.group(1) == "list":
                    found.add((*kinds[m.group(2)], "watch"))
                continue
            m = CALL.match(node.func.attr)
            if m:
                assert m.group(2) in kinds, f"{path.name}: unmapped API call {node.func.attr}"
                assert None not in kinds[m.group(2)], f"{path.name}: no GROUP and PLURAL"
                verb = "get" if m.group(1) == "read" else m.group(1)
                found.add((*kinds[m.group(2)], verb))
    return found


def test_the_scan_finds_the_launchers_calls():
    # If the scan found nothing it would prove nothing: the launcher's core calls must be there.
    found = calls()
    for need in [("trainer.kubeflow.org", "trainjobs", v) for v in ("create", "watch", "delete")]:
        assert need in found, need
    assert ("", "pods/log", "get") in found and ("", "events", "list") in found
    # and the deploy step's: apply, read and watch its InferenceService
    for verb in ("patch", "get", "watch"):
        assert ("serving.kserve.io", "inferenceservices", verb) in found, verb


def test_the_standalone_role_grants_exactly_what_the_steps_call():
    role, binding = [d for d in yaml.safe_load_all(
        (PROJECT / "manifests" / "standalone" / "rbac.yaml").read_text()) if d]  # fmt: skip
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert granted == calls()
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "kubeflow"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}
    ]


def test_kubeflow_edit_grants_what_the_steps_call_in_a_profile_namespace():
    missing = {(g, r, v) for g, r, v in calls() if v not in KUBEFLOW_EDIT.get((g, r), set())}
    assert not missing, f"default-editor may not: {sorted(missing)}"
