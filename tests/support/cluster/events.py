"""Events of the test cluster: what controllers record about an object, where the step can read it.

The test API server has no core API, so Events are files, as pods are (cluster/kubelet.py):
`<logs>/<namespace>/.events/<event>.json`, which
components/trainjob/warning_events.py's `LogDirEvents` reads.

Kubeflow Trainer v2.3.0 records through controller-runtime v0.24.1's `GetEventRecorder`
(pkg/internal/recorder/recorder.go), that is client-go's `tools/events`: events.k8s.io/v1
Events. Each file is such an Event as `GET /api/v1/namespaces/<ns>/events` shows it (kubernetes
pkg/apis/events/v1/conversion.go: `regarding` -> `involvedObject`, `note` -> `message`; `count`,
`firstTimestamp` and `lastTimestamp` come from the deprecated fields, which tools/events never
sets): `involvedObject`, `type`, `reason`, `message`, `action`, `eventTime`,
`reportingComponent`, `reportingInstance`, and `series` once repeated.

How repeats are written (client-go tools/events/event_broadcaster.go, recordToSink): the
first Event of a key (type, action, reason, reporting controller and instance, the regarding
object with its resourceVersion, the related one) is created; the second turns it into a series
of count 2 (a patch); later ones only count in the recorder's memory, written by a ticker every
30 minutes (refreshTime) or once the series has been quiet for 6 (finishTime). No test here
runs that long, so the model writes the first two and counts the rest in memory.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EVENTS_DIR = ".events"


def _micro_time(now: float) -> str:
    """metav1.MicroTime as JSON: RFC 3339 with microseconds."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """One controller's `events.EventRecorder`, writing into the pod-log folder's namespaces."""

    def __init__(self, logs: Path, controller: str) -> None:
        self.logs, self.controller = logs, controller
        self.instance = f"{controller}-{socket.gethostname()}"  # tools/events NewRecorder
        self._lock = threading.Lock()
        self._series: dict[tuple[Any, ...], dict[str, Any]] = {}

    def eventf(
        self, regarding: dict[str, Any], type_: str, reason: str, action: str, note: str
    ) -> None:
        """`Eventf(regarding, nil, type, reason, action, note)`, as Trainer calls it."""
        meta = regarding["metadata"]
        ref = {"kind": regarding["kind"], "namespace": meta["namespace"], "name": meta["name"],
               "uid": meta.get("uid"), "apiVersion": regarding["apiVersion"],
               "resourceVersion": meta.get("resourceVersion")}  # fmt: skip
        key = (type_, action, reason, self.controller, self.instance, tuple(ref.items()))
        now = time.time()
        with self._lock:
            if (event := self._series.get(key)) is None:
                # tools/events event_recorder.go makeEvent: `<regarding name>.<UnixNano in hex>`.
                event = {
                    "metadata": {"name": f"{meta['name']}.{time.time_ns():x}",
                                 "namespace": meta["namespace"]},
                    "involvedObject": ref, "type": type_, "reason": reason, "message": note,
                    "action": action, "eventTime": _micro_time(now),
                    "reportingComponent": self.controller, "reportingInstance": self.instance,
                }  # fmt: skip
                self._series[key] = event
            elif "series" not in event:
                event["series"] = {"count": 2, "lastObservedTime": _micro_time(now)}
            else:
                event["series"] = {"count": event["series"]["count"] + 1,
                                   "lastObservedTime": _micro_time(now)}  # fmt: skip
                return  # counted in memory until a refresh this model never reaches
            self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        folder = self.logs / event["metadata"]["namespace"] / EVENTS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        write_whole(folder / f"{event['metadata']['name']}.json", json.dumps(event))


def write_whole(path: Path, text: str) -> None:
    """Write one of the test cluster's object files as the API server shows an object: whole or
    not at all to a reader (a temporary name beside it, then a rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class CoreEventRecorder:
    """A controller's older `record.EventRecorder` (client-go tools/record, core/v1 Events), as
    KServe v0.20.0's InferenceService controller records (cmd/manager/main.go: source component
    `v1beta1Controllers`).

    tools/record/event.go (makeEvent) and events_cache.go (EventCorrelator, eventLogger): an
    Event `<involved name>.<UnixNano in hex>` with `count` 1 and `firstTimestamp` =
    `lastTimestamp`; the same one again (the involved object, type, reason, message, source)
    counts up and moves `lastTimestamp` (a patch). Its aggregation of ten similar messages and
    its spam filter (25 per object, then one per 5 minutes) are not modelled.
    """

    def __init__(self, logs: Path, component: str) -> None:
        self.logs, self.component = logs, component
        self._lock = threading.Lock()
        self._seen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def eventf(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = involved["metadata"]
        ref = {"kind": involved["kind"], "namespace": meta["namespace"], "name": meta["name"],
               "uid": meta.get("uid"), "apiVersion": involved["apiVersion"],
               "resourceVersion": meta.get("resourceVersion")}  # fmt: skip
        key = (type_, reason, message, ref["kind"], ref["name"], ref["uid"])
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            event = self._seen.get(key)
            if event is None:
                event = self._seen[key] = {
                    "metadata": {"name": f"{meta['name']}.{time.time_ns():x}",
                                 "namespace": meta["namespace"]},
                    "involvedObject": ref, "reason": reason, "message": message,
                    "source": {"component": self.component}, "firstTimestamp": now,
                    "lastTimestamp": now, "count": 1, "type": type_, "eventTime": None,
                    "reportingComponent": self.component, "reportingInstance": "",
                }  # fmt: skip
            else:
                event["count"] += 1
                event["lastTimestamp"] = now
            folder = self.logs / meta["namespace"] / EVENTS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            write_whole(folder / f"{event['metadata']['name']}.json", json.dumps(event))
