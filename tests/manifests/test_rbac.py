"""What the steps call on the Kubernetes API equals what each way of running KFP grants them.

The calls are read from components/ itself (every `<verb>_namespaced_<kind>` call of the
kubernetes client, and `Watch.stream` over a list call, which the API server authorises as
`watch`), so a new call the grants lack fails here, before a cluster says 403.
- Standalone KFP: the steps run as `kubeflow:pipeline-runner`; manifests/standalone/rbac.yaml's
  Role must grant exactly those calls.
- Multi-user Kubeflow: the steps run as `<profile>:default-editor`, bound to `kubeflow-edit`;
  `KUBEFLOW_EDIT` below is what upstream aggregates into it, and must cover the calls.
"""

from __future__ import annotations

import ast
import re

import yaml
from support.paths import PROJECT

CALL = re.compile(r"^(create|get|list|read|delete|patch|replace)_namespaced_(\w+)$")
# The kubernetes client's names for the kinds components/ uses: (API group, resource).
RESOURCES = {
    "custom_object": ("trainer.kubeflow.org", "trainjobs"),  # the launcher's only CR
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
_READ = {"get", "list", "watch"}
KUBEFLOW_EDIT = {
    ("trainer.kubeflow.org", "trainjobs"): {"create", "patch", "delete"} | _READ,
    ("", "pods"): _READ,
    ("", "pods/log"): _READ,
    ("", "events"): _READ,
    ("", "persistentvolumeclaims"): _READ,
}


def calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every API call in components/."""
    found = set()
    for path in sorted((PROJECT / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "stream" and node.args and isinstance(node.args[0], ast.Attribute):
                m = CALL.match(node.args[0].attr)
                if m and m.group(1) == "list":
                    found.add((*RESOURCES[m.group(2)], "watch"))
                continue
            m = CALL.match(node.func.attr)
            if m:
                assert m.group(2) in RESOURCES, f"{path.name}: unmapped API call {node.func.attr}"
                verb = "get" if m.group(1) == "read" else m.group(1)
                found.add((*RESOURCES[m.group(2)], verb))
    return found


def test_the_scan_finds_the_launchers_calls():
    # If the scan found nothing it would prove nothing: the launcher's core calls must be there.
    found = calls()
    for need in [("trainer.kubeflow.org", "trainjobs", v) for v in ("create", "watch", "delete")]:
        assert need in found, need
    assert ("", "pods/log", "get") in found and ("", "events", "list") in found


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
