"""The Warning Events of an object: why a TrainJob that started nothing is stuck.

Kubeflow Trainer v2.3 says a JobSet it could not create (refused by JobSet's webhook, say) only
as a Warning Event `TrainJobResourcesCreationFailed` on the TrainJob, never as a condition, so
the launcher reads Events to fail such a step with the reason. Two sources, chosen as
components/podlogs.py chooses: the core API on a cluster, the test cluster's folder
(`<GPT_POD_LOG_DIR>/<namespace>/.events/*.json`) where there is no core API.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from components.podlogs import LOG_DIR_ENV

EVENTS_DIR = ".events"


class MissingPermission(PermissionError):
    """The step's service account may not do what the step needs (a 403), said in one line."""

    def __init__(self, verb: str, resource: str, namespace: str) -> None:
        super().__init__(
            f"the step's service account may not {verb} {resource} in namespace {namespace} "
            f"(403 Forbidden): grant it (see manifests/) and run again"
        )


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    count: int
    last_timestamp: str

    def __str__(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.reason}: {self.message}{times}"


class Events(Protocol):
    def warnings(self, namespace: str, kind: str, name: str) -> list[Event]:
        """The object's Warning Events, oldest first."""
        ...


def _event(obj: dict[str, Any]) -> Event:
    last = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp") or ""
    return Event(obj.get("reason") or "", obj.get("message") or "", obj.get("count") or 1,
                 str(last))  # fmt: skip


class CoreV1Events:
    """`GET /api/v1/namespaces/<ns>/events` by the involved object's kind and name."""

    def warnings(self, namespace: str, kind: str, name: str) -> list[Event]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.CoreV1Api()
        try:
            found = api.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.kind={kind},involvedObject.name={name},type=Warning",
            ).items
        except ApiException as e:
            if e.status == 403:
                raise MissingPermission("list", "events", namespace) from None
            raise
        events = [_event(api.api_client.sanitize_for_serialization(e)) for e in found]
        return sorted(events, key=lambda e: e.last_timestamp)


class LogDirEvents:
    """Events as the test cluster writes them (tests/cluster/events.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def warnings(self, namespace: str, kind: str, name: str) -> list[Event]:
        events = []
        for path in (self.root / namespace / EVENTS_DIR).glob("*.json"):
            obj = json.loads(path.read_text())
            involved = obj.get("involvedObject") or {}
            if (involved.get("kind"), involved.get("name"), obj.get("type")) == (
                kind, name, "Warning"
            ):  # fmt: skip
                events.append(_event(obj))
        return sorted(events, key=lambda e: e.last_timestamp)


def from_environment() -> Events:
    """`LogDirEvents` where `GPT_POD_LOG_DIR` names a folder, else the cluster's core API."""
    root = os.environ.get(LOG_DIR_ENV)
    return LogDirEvents(Path(root)) if root else CoreV1Events()
