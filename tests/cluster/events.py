"""Events of the test cluster: what controllers record about an object, where the step can read it.

The test API server has no core API, so Events are files, as pods are (cluster/kubelet.py):
`<logs>/<namespace>/.events/<event>.json`, each a core/v1 Event (`involvedObject`, `type`,
`reason`, `message`, `count`, `firstTimestamp`, `lastTimestamp`, `source`), which
components/events.py's `LogDirEvents` reads. Like client-go's event recorder
(k8s.io/client-go tools/record/events_cache.go, EventAggregator / eventLogger), a repeat of the
same object, type, reason and message updates one Event's count and lastTimestamp rather than
adding another.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EVENTS_DIR = ".events"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records Events into the pod-log folder's namespaces."""

    def __init__(self, logs: Path, component: str) -> None:
        self.logs, self.component = logs, component
        self._lock = threading.Lock()

    def record(self, obj: dict[str, Any], kind: str, type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        folder = self.logs / meta["namespace"] / EVENTS_DIR
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            for path in folder.glob(f"{meta['name']}.*.json"):
                event = json.loads(path.read_text())
                if (event["involvedObject"].get("uid"), event["type"], event["reason"],
                        event["message"]) == (meta.get("uid"), type_, reason, message):  # fmt: skip
                    event.update(count=event["count"] + 1, lastTimestamp=_now())
                    break
            else:
                # kubernetes: an Event's name is `<object>.<hex>` (client-go makeEvent).
                path = folder / f"{meta['name']}.{secrets.token_hex(8)}.json"
                event = {
                    "metadata": {"name": path.stem, "namespace": meta["namespace"]},
                    "involvedObject": {"kind": kind, "name": meta["name"],
                                       "namespace": meta["namespace"], "uid": meta.get("uid"),
                                       "apiVersion": obj.get("apiVersion")},  # fmt: skip
                    "type": type_, "reason": reason, "message": message, "count": 1,
                    "firstTimestamp": _now(), "lastTimestamp": _now(),
                    "source": {"component": self.component},
                }  # fmt: skip
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(event))
            os.replace(tmp, path)
