"""Where a TrainJob's pods and their logs are read from: one small interface, two sources.

The launcher reads the node-0 pod's log (the stage's output, components/stagelog.py) and the
prompt stage names the pod to attach to. On a cluster both come from the core API
(`CoreV1PodLogs`). The test cluster (tests/cluster/) runs next to an API server that has no core
API group, so it writes each pod's log into a folder instead (`LogDirPodLogs`), the way a node
keeps container logs on disk; `GPT_POD_LOG_DIR` selects that source, for the whole step process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

# The JobSet the Trainer creates for a TrainJob has the TrainJob's name; its pods carry this label.
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The node index of a pod of an Indexed Job (the Trainer's PET_NODE_RANK comes from it).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# The container every runtime of this project names (and the Trainer SDK expects).
CONTAINER = "node"
LOG_DIR_ENV = "GPT_POD_LOG_DIR"


class PodLogs(Protocol):
    """The pods of a TrainJob and their logs."""

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        """Names of the TrainJob's pods, node 0 first; empty when there are none (yet)."""
        ...

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        """The `node` container's log (its last `tail_lines` lines, or all of it)."""
        ...


def _node_order(labels: dict[str, str] | None, name: str) -> tuple[int, str]:
    index = (labels or {}).get(INDEX_LABEL, "")
    return (int(index) if index.isdigit() else 1 << 30, name)


class CoreV1PodLogs:
    """The cluster's core API: pods by label, `pods/log` of container `node`."""

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            items = (
                client.CoreV1Api()
                .list_namespaced_pod(namespace, label_selector=f"{JOBSET_LABEL}={trainjob}")
                .items
            )
        except ApiException as e:
            if e.status in (403, 404):  # no pods permission or no core group (a CRD-only server)
                return []
            raise
        items = sorted(items, key=lambda p: _node_order(p.metadata.labels, p.metadata.name))
        return [p.metadata.name for p in items]

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            return client.CoreV1Api().read_namespaced_pod_log(
                pod, namespace, container=CONTAINER, tail_lines=tail_lines
            )
        except ApiException as e:
            return f"(log of pod {pod} unavailable: {e.status} {e.reason})"


class LogDirPodLogs:
    """Pods as folders `<root>/<namespace>/<pod>/` holding `labels.json` and `<container>.log`.

    The layout is the test cluster's (tests/cluster/kubelet.py writes it); a pod whose folder is
    gone was deleted, as on a cluster.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        found = []
        for labels_json in (self.root / namespace).glob("*/labels.json"):
            labels = json.loads(labels_json.read_text())
            if labels.get(JOBSET_LABEL) == trainjob:
                found.append(_node_order(labels, labels_json.parent.name))
        return [name for _, name in sorted(found)]

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        path = self.root / namespace / pod / f"{CONTAINER}.log"
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return f"(log of pod {pod} unavailable: no {path})"
        if tail_lines is None:
            return text
        return "".join(text.splitlines(keepends=True)[-tail_lines:])


def from_environment() -> PodLogs:
    """`LogDirPodLogs` where `GPT_POD_LOG_DIR` names a folder, else the cluster's core API."""
    root = os.environ.get(LOG_DIR_ENV)
    return LogDirPodLogs(Path(root)) if root else CoreV1PodLogs()


def node0_log(source: PodLogs, namespace: str, trainjob: str, tail_lines: int | None) -> str:
    """The log of the TrainJob's node-0 pod (the one that prints results), or why there is none."""
    pods = source.pods(namespace, trainjob)
    if not pods:
        return f"(no pods found with label {JOBSET_LABEL}={trainjob})"
    return source.log(namespace, pods[0], tail_lines)
