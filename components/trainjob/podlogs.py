"""Where a TrainJob's pods and their logs are read from: one small interface, two sources.

The launcher follows the node-0 pod's log while the TrainJob runs
(components/trainjob/logfollow.py), reads it once more at the end (the stage's output,
components/trainjob/stagelog.py), and the prompt stage names the pod to attach to. The kubelet
rotates a container's log (at 10 MiB by default): a plain read returns only the current file, a
followed one goes on across rotations. On a cluster all come from the core API (`CoreV1PodLogs`).
The test cluster (tests/support/cluster/) runs next to an API server that has no core API group,
so it writes each pod's log into a folder instead (`LogDirPodLogs`), the way a node keeps container
logs on disk; `GPT_POD_LOG_DIR` selects that source, for the whole step process.

Each pod also says why it is not running yet (its phase, the scheduler's or the kubelet's reason),
which the launcher needs to fail a stuck TrainJob with that reason
(components/trainjob/launcher.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# The JobSet the Trainer creates for a TrainJob has the TrainJob's name; its pods carry this label.
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The node index of a pod of an Indexed Job (the Trainer's PET_NODE_RANK comes from it).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# The container every runtime of this project names (and the Trainer SDK expects).
# The JobSet's count of restarts (all Jobs recreated), on each pod it makes (kubernetes-sigs/jobset
# pkg/constants/constants.go RestartsKey, v0.12.0).
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
CONTAINER = "node"
LOG_DIR_ENV = "GPT_POD_LOG_DIR"
# How often a followed log folder is looked at when nothing new was written.
FOLLOW_POLL_S = 0.05
# The pod's status (core/v1 PodStatus JSON) and uid in a `LogDirPodLogs` pod folder.
STATUS_FILE, UID_FILE = "status.json", "uid"


class MissingPermission(PermissionError):
    """The step's service account may not do what the step needs (a 403), said in one line."""

    def __init__(self, verb: str, resource: str, namespace: str) -> None:
        super().__init__(
            f"the step's service account may not {verb} {resource} in namespace {namespace} "
            f"(403 Forbidden): grant it (see manifests/) and run again"
        )


@dataclass(frozen=True)
class PodRef:
    """A pod of a TrainJob and the JobSet restart it belongs to (what identifies it), with what
    its status said when it was listed."""

    name: str
    restart_attempt: int
    uid: str = field(default="", compare=False)
    created: float = field(default=0.0, compare=False)
    """metadata.creationTimestamp, seconds since the epoch."""
    phase: str = field(default="", compare=False)
    """status.phase: Pending until its container runs ("" where the source has no status)."""
    waiting: str = field(default="", compare=False)
    """Why it is not running, from its status (`Unschedulable: 0/2 nodes are available: ...`,
    `ImagePullBackOff: Back-off pulling image "..."`, `ContainerCreating`), else ""."""


def waiting(status: dict[str, Any]) -> str:
    """Why a pod does not run, from its core/v1 PodStatus (JSON): the scheduler's PodScheduled
    False condition (kubernetes pkg/scheduler/schedule_one.go handleSchedulingFailure), else the
    `node` container's waiting state (pkg/kubelet/kubelet_pods.go
    convertToAPIContainerStatuses: the reason and message of its last failed start), as
    `reason: message`; "" when neither says anything."""
    said = [c for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"]  # fmt: skip
    said += [(c.get("state") or {}).get("waiting") or {}
             for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER]
    for part in said:
        if part.get("reason"):
            return ": ".join(filter(None, (part["reason"], part.get("message"))))
    return ""


class PodLogs(Protocol):
    """The pods of a TrainJob and their logs."""

    def refs(self, namespace: str, trainjob: str) -> list[PodRef]:
        """The TrainJob's pods, node 0 first and each node's newest pod first; empty when there
        are none (yet). Raises MissingPermission where pods may not be listed."""
        ...

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        """The names of `refs`."""
        ...

    def node0(self, namespace: str, trainjob: str) -> PodRef | None:
        """The newest pod of node 0, or None."""
        ...

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        """The `node` container's current log file (its last `tail_lines` lines, or all)."""
        ...

    def follow(self, namespace: str, pod: str) -> Iterator[str]:
        """The `node` container's log line by line as it is written, from the start of its
        current file, across rotations, until the container ends. Raises while it has not
        started."""
        ...


def _newest_first(pods: Iterable[tuple[dict[str, Any], str, dict[str, Any]]]) -> list[PodRef]:
    """(labels, name, a PodRef's other fields) sorted node 0 first, then the newest JobSet
    restart and the newest pod (a Job's retry of a failed pod keeps the old one) of each node."""

    def key(pod: tuple[dict[str, Any], str, dict[str, Any]]) -> tuple[int, int, float, str]:
        labels, name, more = pod
        index = labels.get(INDEX_LABEL, "")
        return (int(index) if index.isdigit() else 1 << 30, -_attempt(labels), -more["created"],
                name)  # fmt: skip

    return [PodRef(name, _attempt(labels), **more) for labels, name, more in sorted(pods, key=key)]


def _seen(uid: str, created: float, status: dict[str, Any]) -> dict[str, Any]:
    """A PodRef's fields beyond its name and attempt."""
    return {"uid": uid, "created": created, "phase": status.get("phase") or "",
            "waiting": waiting(status)}  # fmt: skip


def _attempt(labels: dict[str, str]) -> int:
    value = labels.get(RESTART_LABEL, "")
    return int(value) if value.isdigit() else 0


class CoreV1PodLogs:
    """The cluster's core API: pods by label, `pods/log` of container `node`."""

    def refs(self, namespace: str, trainjob: str) -> list[PodRef]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.CoreV1Api()
        try:
            items = api.list_namespaced_pod(
                namespace, label_selector=f"{JOBSET_LABEL}={trainjob}"
            ).items
        except ApiException as e:
            if e.status == 403:  # a Role without `pods list`: not the same as no pods
                raise MissingPermission("list", "pods", namespace) from None
            if e.status == 404:  # no core group (a CRD-only server, as the test API server)
                return []
            raise
        return _newest_first(
            (p.metadata.labels or {}, p.metadata.name,
             _seen(p.metadata.uid or "", _timestamp(p.metadata.creation_timestamp),
                   api.api_client.sanitize_for_serialization(p.status) or {}))
            for p in items
        )  # fmt: skip

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        return [p.name for p in self.refs(namespace, trainjob)]

    def node0(self, namespace: str, trainjob: str) -> PodRef | None:
        return next(iter(self.refs(namespace, trainjob)), None)

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            return client.CoreV1Api().read_namespaced_pod_log(
                pod, namespace, container=CONTAINER, tail_lines=tail_lines
            )
        except ApiException as e:
            return f"(log of pod {pod} unavailable: {e.status} {e.reason})"

    def follow(self, namespace: str, pod: str) -> Iterator[str]:
        # The kubelet serves a followed log from its reader that reopens the file after a
        # rotation (kubernetes pkg/kubelet/kuberuntime/logs/logs.go ReadLogs, waitLogs) and
        # ends the stream when the container is no longer running.
        from kubernetes import client

        response = client.CoreV1Api().read_namespaced_pod_log(
            pod, namespace, container=CONTAINER, follow=True, _preload_content=False
        )
        try:
            yield from _lines(response.stream(1 << 16))
        finally:
            response.release_conn()


class LogDirPodLogs:
    """Pods as folders `<root>/<namespace>/<pod>/` holding `labels.json`, `uid`,
    `status.json` (core/v1 PodStatus) and `<container>.log`.

    The layout is the test cluster's (tests/support/cluster/kubelet.py writes it); a pod whose
    folder is gone was deleted, as on a cluster.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def refs(self, namespace: str, trainjob: str) -> list[PodRef]:
        found = []
        for labels_json in (self.root / namespace).glob("*/labels.json"):
            # labels.json appears whole, once, when the pod is created, after its uid and
            # first status; the status file is replaced whole as the pod goes on. A pod
            # deleted since the glob (its folder moved away) is no longer listed, as the API
            # server would not list it.
            try:
                labels, created = json.loads(labels_json.read_text()), labels_json.stat().st_mtime
            except FileNotFoundError:
                continue
            if labels.get(JOBSET_LABEL) == trainjob:
                folder = labels_json.parent
                found.append((labels, folder.name, _seen(
                    _read(folder / UID_FILE), created,
                    json.loads(_read(folder / STATUS_FILE) or "{}"))))  # fmt: skip
        return _newest_first(found)

    def pods(self, namespace: str, trainjob: str) -> list[str]:
        return [p.name for p in self.refs(namespace, trainjob)]

    def node0(self, namespace: str, trainjob: str) -> PodRef | None:
        return next(iter(self.refs(namespace, trainjob)), None)

    def log(self, namespace: str, pod: str, tail_lines: int | None) -> str:
        path = self.root / namespace / pod / f"{CONTAINER}.log"
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return f"(log of pod {pod} unavailable: no {path})"
        if tail_lines is None:
            return text
        return "".join(text.splitlines(keepends=True)[-tail_lines:])

    def follow(self, namespace: str, pod: str) -> Iterator[str]:
        """As the kubelet's reader (kubernetes pkg/kubelet/kuberuntime/logs/logs.go ReadLogs,
        waitLogs): at the end of the open file, a container that has ended (`node.exit`, or
        the pod gone) ends the stream after one more read; a file rotated away is read to its
        end, then the new file at the log's path is opened; else wait and read again."""
        folder = self.root / namespace / pod
        yield from _lines(_chunks(folder, folder / f"{CONTAINER}.log"))


def _chunks(folder: Path, path: Path) -> Iterator[bytes]:
    """LogDirPodLogs.follow's reads of the log at `path`, the open file swapped at rotations."""
    f = open(path, "rb")  # noqa: SIM115
    ended = False
    try:
        while True:
            chunk = f.read(1 << 16)
            if chunk:
                yield chunk
                continue
            if ended:
                return
            ended = (folder / f"{CONTAINER}.exit").exists() or not folder.exists()
            if ended:
                continue
            try:
                rotated = os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
            except FileNotFoundError:  # renamed away, not reopened yet
                rotated = False
            if rotated:
                # The runtime writes to the old file until it reopens, and the new file
                # exists only after that: one more read of the old one misses nothing.
                yield f.read()
                f.close()
                f = open(path, "rb")  # noqa: SIM115
                continue
            time.sleep(FOLLOW_POLL_S)
    finally:
        f.close()


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines of a byte stream, decoded; a last line without its newline too."""
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def _read(path: Path) -> str:
    """A pod folder's file, or "" (a folder written before it, or the pod deleted meanwhile)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _timestamp(when: Any) -> float:
    return when.timestamp() if when is not None else 0.0


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
