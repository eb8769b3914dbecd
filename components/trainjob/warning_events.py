"""The Warning Events of an object: why a TrainJob that started nothing is stuck.

Kubeflow Trainer v2.3 says a JobSet it could not create (refused by JobSet's webhook, say) only
as a Warning Event `TrainJobResourcesCreationFailed` on the TrainJob, never as a condition, so
the launcher reads Events to fail such a step with the reason. Two sources, chosen as
components/trainjob/podlogs.py chooses: the core API on a cluster, the test cluster's folder
(`<GPT_POD_LOG_DIR>/<namespace>/.events/*.json`) where there is no core API.

Trainer records events.k8s.io/v1 Events (client-go tools/events); read through core/v1 they
carry `eventTime` and, once repeated, `series` {count, lastObservedTime}, and no
`count`/`lastTimestamp`, which only the older core/v1 recorders set. Both shapes are read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

# MissingPermission is defined beside the pods, which this module builds on; it is one error
# for every 403 a step meets (pods, events, persistentvolumeclaims).
from components.trainjob.podlogs import LOG_DIR_ENV, MissingPermission

EVENTS_DIR = ".events"


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    count: int
    """How many times it happened, as far as the API server was told (a series' count)."""
    last_timestamp: str
    """When it was last seen (UTC, ISO 8601 with microseconds): what orders Events."""

    def __str__(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.reason}: {self.message}{times}"


class Events(Protocol):
    def warnings(self, namespace: str, kind: str, name: str, uid: str) -> list[Event]:
        """The Warning Events of the object `kind` `name` with `uid`, oldest last seen first."""
        ...


def _event(obj: dict[str, Any]) -> Event:
    series = obj.get("series") or {}
    last = (series.get("lastObservedTime") or obj.get("lastTimestamp") or obj.get("eventTime")
            or obj.get("firstTimestamp"))  # fmt: skip
    count = series.get("count") or obj.get("count") or 1
    return Event(obj.get("reason") or "", obj.get("message") or "", count, _instant(last))


def _instant(text: Any) -> str:
    """A timestamp as UTC ISO 8601 with microseconds, so that the order of strings is of time
    whatever the source wrote (`Z`, `+00:00`, seconds or microseconds)."""
    if not text:
        return ""
    when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class CoreV1Events:
    """`GET /api/v1/namespaces/<ns>/events` by the involved object's kind and name."""

    def warnings(self, namespace: str, kind: str, name: str, uid: str) -> list[Event]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.CoreV1Api()
        # kubernetes pkg/registry/core/event/strategy.go (ToSelectableFields): the fields an
        # Event list may be selected by.
        selector = (f"involvedObject.kind={kind},involvedObject.name={name},"
                    f"involvedObject.uid={uid},type=Warning")  # fmt: skip
        try:
            found = api.list_namespaced_event(namespace, field_selector=selector).items
        except ApiException as e:
            if e.status == 403:
                raise MissingPermission("list", "events", namespace) from None
            raise
        events = [_event(api.api_client.sanitize_for_serialization(e)) for e in found]
        return sorted(events, key=lambda e: e.last_timestamp)


class LogDirEvents:
    """Events as the test cluster writes them (tests/support/cluster/events.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def warnings(self, namespace: str, kind: str, name: str, uid: str) -> list[Event]:
        events = []
        for path in (self.root / namespace / EVENTS_DIR).glob("*.json"):
            obj = json.loads(path.read_text())
            involved = obj.get("involvedObject") or {}
            seen = (involved.get("kind"), involved.get("name"), involved.get("uid"), obj["type"])
            if seen == (kind, name, uid, "Warning"):
                events.append(_event(obj))
        return sorted(events, key=lambda e: e.last_timestamp)


def from_environment() -> Events:
    """`LogDirEvents` where `GPT_POD_LOG_DIR` names a folder, else the cluster's core API."""
    root = os.environ.get(LOG_DIR_ENV)
    return LogDirEvents(Path(root)) if root else CoreV1Events()
