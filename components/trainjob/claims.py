"""The access modes of the PVC the stages share: can pods on several nodes mount it?

A ReadWriteOnce (or ReadWriteOncePod) volume is attached to one node at a time; a second node's
pod waits in ContainerCreating with a Multi-Attach error until the step's timeout (kubernetes
pkg/controller/volume/attachdetach/reconciler/reconciler.go). So a multi-node TrainJob is refused
before it is created unless the claim is ReadWriteMany. Two sources, chosen as
components/trainjob/podlogs.py chooses: the core API on a cluster, the test cluster's folder
(`<GPT_POD_LOG_DIR>/<namespace>/.claims/<claim>.json`, a core/v1 PVC) where there is none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

from components.trainjob.podlogs import LOG_DIR_ENV
from components.trainjob.warning_events import MissingPermission

CLAIMS_DIR = ".claims"
# The claim every runtime mounts at /gpt (runtimes/*.yaml, manifests/base/pvc.yaml).
CLAIM = "gpt-pvc"
MULTI_NODE = "ReadWriteMany"


class ClaimNotFound(ValueError):
    def __init__(self, namespace: str, claim: str) -> None:
        super().__init__(
            f"PVC {claim} not found in namespace {namespace}: apply manifests/standalone or "
            f"manifests/profile there first (docs/cluster.md, step 3)"
        )


class Claims(Protocol):
    def access_modes(self, namespace: str, claim: str) -> list[str]:
        """The claim's spec.accessModes; ClaimNotFound when there is no such claim."""
        ...


class CoreV1Claims:
    """`GET /api/v1/namespaces/<ns>/persistentvolumeclaims/<claim>`."""

    def access_modes(self, namespace: str, claim: str) -> list[str]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from components.trainjob.launcher import load_kube_config

        load_kube_config()
        try:
            pvc = client.CoreV1Api().read_namespaced_persistent_volume_claim(claim, namespace)
        except ApiException as e:
            if e.status == 403:
                raise MissingPermission("get", "persistentvolumeclaims", namespace) from None
            if e.status == 404:
                raise ClaimNotFound(namespace, claim) from None
            raise
        return list(pvc.spec.access_modes or [])


class LogDirClaims:
    """Claims as the test cluster writes them (tests/support/cluster/kubelet.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def access_modes(self, namespace: str, claim: str) -> list[str]:
        try:
            pvc = json.loads((self.root / namespace / CLAIMS_DIR / f"{claim}.json").read_text())
        except FileNotFoundError:
            raise ClaimNotFound(namespace, claim) from None
        return list(pvc["spec"]["accessModes"])


def from_environment() -> Claims:
    """`LogDirClaims` where `GPT_POD_LOG_DIR` names a folder, else the cluster's core API."""
    root = os.environ.get(LOG_DIR_ENV)
    return LogDirClaims(Path(root)) if root else CoreV1Claims()


def check_multi_node(num_nodes: int, namespace: str, claims: Claims | None = None) -> None:
    """Refuse `num_nodes` > 1 on a claim pods on several nodes cannot mount (one line)."""
    if num_nodes <= 1:
        return
    modes = (claims or from_environment()).access_modes(namespace, CLAIM)
    if MULTI_NODE not in modes:
        raise ValueError(
            f"num_nodes {num_nodes}: PVC {CLAIM} in namespace {namespace} is "
            f"{'/'.join(modes) or 'without access modes'}, which pods on only one node can mount; "
            f"make it {MULTI_NODE} (docs/cluster.md, step 3) or train on one node"
        )
