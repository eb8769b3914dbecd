"""Waiting for an InferenceService to be Ready, and reading why it is not, from its status.

What KServe v0.20.0 writes there (kserve/kserve at v0.20.0,
`pkg/apis/serving/v1beta1/inference_service_status.go`):
- conditions `PredictorReady` and `IngressReady`, and `Ready` from both (a living condition
  set); in raw deployment `PredictorReady` follows the predictor's Deployment
  (PropagateRawStatus): False with the Deployment's reason, `MinimumReplicasUnavailable` while
  no pod is ready, `ProgressDeadlineExceeded` once the Deployment gave up, a `ReplicaFailure`'s
  reason when pods cannot be created;
- `modelStatus` (PropagateModelStatus, UpdateModelRevisionStates): `transitionStatus`
  `BlockedByFailedLoad` with `lastFailureInfo` {reason `ModelLoadFailed`, message, exitCode}
  when the storage initializer or the server's container failed (terminated with an error, or
  in CrashLoopBackOff), `InvalidSpec` when the predictor could not be built (no runtime
  supports the format, `NoSupportingRuntime`, ...);
- `address.url`, the predictor's cluster address (`http://<name>-predictor.<namespace>.svc...`,
  `reconcilers/ingress/kube_ingress_reconciler.go` createAddress), once the ingress is
  reconciled.
A server that crashes changes nothing KServe watches: it writes `BlockedByFailedLoad` at its
next reconcile (the Deployment's progress deadline passing, 600 s,
`reconcilers/deployment/deployment_reconciler.go`, brings one) if the container is down at that
moment; one caught restarting stays `Pending`, and the deadline's line says to read its log.
An image that does not pull leaves the Deployment short of replicas and the model `Pending`:
KServe's status does not name the image, so the deadline's line says where to look.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from components.serving.inferenceservice import GROUP, PLURAL, VERSION, ServingError

# Reasons after which the predictor's Deployment will not become available by waiting.
GIVEN_UP = {"ProgressDeadlineExceeded", "FailedCreate"}
FAILED_TRANSITIONS = {"BlockedByFailedLoad", "InvalidSpec"}
NO_STATUS = "no status yet: KServe's controller has not reconciled it"
# Longest single watch request; the server closes it and the watch resumes.
WATCH_WINDOW_S = 60


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _said(condition: dict[str, Any]) -> str:
    parts = [condition.get("reason") or "", " ".join((condition.get("message") or "").split())]
    return ": ".join(p for p in parts if p) or "no reason given"


def address(obj: dict[str, Any]) -> str:
    """status.address.url, or ""."""
    return (((obj.get("status") or {}).get("address") or {}).get("url")) or ""


def failure(obj: dict[str, Any]) -> str:
    """Why the predictor failed for good (KServe's reason and message), or "" while waiting
    may still see it Ready."""
    model = (obj.get("status") or {}).get("modelStatus") or {}
    if model.get("transitionStatus") in FAILED_TRANSITIONS:
        info = model.get("lastFailureInfo") or {}
        exit_code = f" (exit code {info['exitCode']})" if info.get("exitCode") else ""
        where = f" in {info['location']}" if info.get("location") else ""
        why = _said(info) if info else "no failure info"
        return f"{model['transitionStatus']}: {why}{exit_code}{where}"
    predictor = _conditions(obj).get("PredictorReady") or {}
    if predictor.get("status") == "False" and predictor.get("reason") in GIVEN_UP:
        return f"PredictorReady False: {_said(predictor)}"
    return ""


def waiting(obj: dict[str, Any]) -> str:
    """What the status says while not Ready: its first condition that is not True, and the
    model's state."""
    status = obj.get("status") or {}
    if not status.get("conditions"):
        return NO_STATUS
    conditions = _conditions(obj)
    parts = []
    for kind in ("PredictorReady", "IngressReady", "Ready"):
        c = conditions.get(kind)
        if c and c.get("status") != "True":
            parts.append(f"{kind} {c.get('status')}: {_said(c)}")
            break
    state = ((status.get("modelStatus") or {}).get("states") or {}).get("targetModelState")
    if state:
        parts.append(f"model {state}")
    if conditions.get("Ready", {}).get("status") == "True" and not address(obj):
        parts.append("Ready without status.address.url")
    return "; ".join(parts) or "not Ready"


def ready(obj: dict[str, Any]) -> bool:
    return _conditions(obj).get("Ready", {}).get("status") == "True" and bool(address(obj))


def wait_ready(api: Any, obj: dict[str, Any], timeout: float,
               say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Watch the InferenceService `obj` (as applied) until it is Ready with an address; its
    last version. Raises ServingError when the predictor failed or at the deadline; the
    InferenceService is left as it is, for a look."""
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    where = f"{namespace}/{name}"
    selector = f"-l serving.kserve.io/inferenceservice={name}"
    deadline = time.monotonic() + timeout
    rv = meta["resourceVersion"]
    last = ""
    while True:
        if ready(obj):
            return obj
        if why := failure(obj):
            raise ServingError(
                f"InferenceService {where}: the predictor failed: {why}; its logs: kubectl -n "
                f"{namespace} logs {selector} -c storage-initializer (the model's download) or "
                f"-c kserve-container (the server); it is left in place"
            )
        now = waiting(obj)
        if now != last:
            say(f"InferenceService {where}: {now}")
            last = now
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if now == NO_STATUS:  # nothing ran: no pods to look at
                raise ServingError(
                    f"InferenceService {where}: not Ready within {timeout:g} s: KServe's "
                    "controller never reconciled it: is it running? kubectl get pods -A -l "
                    "control-plane=kserve-controller-manager; it is left in place")  # fmt: skip
            raise ServingError(
                f"InferenceService {where}: not Ready within {timeout:g} s: {now}; kubectl -n "
                f"{namespace} describe pods {selector} says why (an image that does not pull, no "
                f"node with room, a server that keeps exiting: then kubectl -n {namespace} logs "
                f"{selector} -c kserve-container), or raise serve_timeout; it is left in place"
            )
        try:
            stream = watch.Watch().stream(
                api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                field_selector=f"metadata.name={name}", resource_version=rv,
                timeout_seconds=max(1, int(min(remaining, WATCH_WINDOW_S))),
                allow_watch_bookmarks=False)  # fmt: skip
            for event in stream:
                if event["type"] in ("ADDED", "MODIFIED"):
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    break
                if event["type"] == "DELETED":
                    raise ServingError(f"InferenceService {where}: deleted while the step "
                                       "waited for it to be Ready")  # fmt: skip
        except ApiException as e:
            if e.status != 410:
                raise
            # Our version was compacted away: read it again and watch on from now.
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            rv = obj["metadata"]["resourceVersion"]
