"""An InferenceService's status as KServe v0.20.0's controller writes it in raw-deployment
(`Standard`) mode: pure functions of what the controller reads (the predictor Deployment's
conditions, its pods' container states), so that each rule can be checked without a server.

kserve/kserve at v0.20.0:
- `pkg/apis/serving/v1beta1/inference_service_status.go`: the living condition set
  (`conditionSet`: PredictorReady and IngressReady under Ready), `PropagateRawStatus` (the
  Deployment's Available / Progressing / ReplicaFailure conditions as PredictorReady),
  `PropagateRawStatusWithMessages`, `PropagateModelStatus` (the model's states from the first
  pod's `storage-initializer` and `kserve-container` statuses), `UpdateModelRevisionStates`,
  `UpdateModelTransitionStatus`, `SetModelFailureInfo`;
- `pkg/controller/v1beta1/inferenceservice/reconcilers/ingress/kube_ingress_reconciler.go`
  (`Reconcile`, `createRawIngress`, `createAddress`) and `httproute_reconciler.go`
  (`createRawURL`, `getRawServiceHost`), `domain.go` (`GenerateDomainName`), with
  `config/configmap/inferenceservice.yaml`'s ingress defaults;
- knative.dev/pkg `apis/condition_set.go` (the version KServe's go.mod pins), which the condition
  set is: `SetCondition` keeps a condition's lastTransitionTime unless something else changed and
  keeps the list sorted by type; `MarkTrue*` makes Ready True once every dependent is True, else
  copies the unhappy dependent (False before Unknown, newest first); `MarkFalse` of a dependent
  sets Ready False with the same reason and message; `MarkUnknown` likewise, unless a dependent is
  False; conditions outside the set (`Stopped`) have severity Info.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

PREDICTOR_READY, INGRESS_READY = "PredictorReady", "IngressReady"
READY, STOPPED = "Ready", "Stopped"
DEPENDENTS = (PREDICTOR_READY, INGRESS_READY)
SEVERITY_INFO = "Info"  # knative's ConditionSeverityInfo; ConditionSeverityError is "" (omitted)

# pkg/constants/constants.go
STORAGE_INITIALIZER = "storage-initializer"
KSERVE_CONTAINER = "kserve-container"
# config/configmap/inferenceservice.yaml, `ingress`: the defaults KServe installs with.
INGRESS_DOMAIN = "example.com"
URL_SCHEME = "http"
# knative.dev/pkg network.GetClusterDomainName: the cluster's domain without a resolv.conf
# saying otherwise.
CLUSTER_DOMAIN = "cluster.local"

# kubernetes pkg/controller/deployment/util/deployment_util.go: the Deployment's condition types.
AVAILABLE, PROGRESSING, REPLICA_FAILURE = "Available", "Progressing", "ReplicaFailure"


def now() -> str:
    """metav1.Time as JSON: RFC 3339 to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Conditions:
    """knative's ConditionManager over `status.conditions` (a list of condition dicts, changed in
    place) for KServe's living set."""

    def __init__(self, status: dict[str, Any]):
        self.status = status

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.status.get("conditions") or []

    def get(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.items if c["type"] == kind), None)

    def is_true(self, kind: str) -> bool:
        return (self.get(kind) or {}).get("status") == "True"

    def _severity(self, kind: str) -> str:
        return "" if kind in (*DEPENDENTS, READY) else SEVERITY_INFO

    def _set(self, kind: str, status: str, reason: str = "", message: str = "") -> None:
        """SetCondition: replace the condition of `kind`; unchanged but for the time, nothing."""
        new = {"type": kind, "status": status, "severity": self._severity(kind),
               "reason": reason, "message": message}  # fmt: skip
        new = {k: v for k, v in new.items() if v or k in ("type", "status")}
        old = self.get(kind)
        if old is not None and {k: v for k, v in old.items() if k != "lastTransitionTime"} == new:
            return
        new["lastTransitionTime"] = now()
        rest = [c for c in self.items if c["type"] != kind]
        self.status["conditions"] = sorted([*rest, new], key=lambda c: c["type"])

    def initialize(self) -> None:
        """InitializeConditions: Ready Unknown where unset, each dependent Unknown (True if Ready
        is) where unset."""
        if self.get(READY) is None:
            self._set(READY, "Unknown")
        status = "True" if self.is_true(READY) else "Unknown"
        for kind in DEPENDENTS:
            if self.get(kind) is None:
                self._set(kind, status)

    def mark_true(self, kind: str, reason: str = "", message: str = "") -> None:
        self._set(kind, "True", reason, message)
        unhappy = self._unhappy_dependent()
        if unhappy is not None:
            self._set(READY, unhappy["status"], unhappy.get("reason", ""),
                      unhappy.get("message", ""))  # fmt: skip
        elif kind != READY:
            self._set(READY, "True")

    def mark_false(self, kind: str, reason: str = "", message: str = "") -> None:
        for t in (kind, READY) if kind in DEPENDENTS else (kind,):
            self._set(t, "False", reason, message)

    def mark_unknown(self, kind: str, reason: str = "", message: str = "") -> None:
        self._set(kind, "Unknown", reason, message)
        for dependent in DEPENDENTS:
            if (self.get(dependent) or {}).get("status") == "False":
                if (self.get(READY) or {}).get("status") != "False":
                    self.mark_false(READY, reason, message)
                return
        if kind in DEPENDENTS:
            self._set(READY, "Unknown", reason, message)

    def set(self, kind: str, status: str, reason: str = "", message: str = "") -> None:
        """InferenceServiceStatus.SetCondition: by the new condition's status."""
        {"Unknown": self.mark_unknown, "True": self.mark_true,
         "False": self.mark_false}[status](kind, reason, message)  # fmt: skip

    def _unhappy_dependent(self) -> dict[str, Any] | None:
        terminal = [c for c in self.items if c["type"] in DEPENDENTS]
        terminal.sort(key=lambda c: c.get("lastTransitionTime", ""), reverse=True)
        for wanted in ("False", "Unknown"):
            for c in terminal:
                if c["status"] == wanted:
                    return c
        if len(terminal) != len(DEPENDENTS):
            return {"status": "Unknown"}
        return None


def propagate_raw_status_with_messages(status: dict[str, Any], reason: str, message: str) -> None:
    """PropagateRawStatusWithMessages for the predictor: PredictorReady False (an error)."""
    status.setdefault("components", {}).setdefault("predictor", {})
    Conditions(status).set(PREDICTOR_READY, "False", reason, message)


def propagate_raw_status(status: dict[str, Any], deployment: dict[str, Any], url: str) -> None:
    """PropagateRawStatus: the predictor Deployment's conditions as PredictorReady, the
    component's URL once it is ready, the Deployment's observedGeneration."""
    conditions = {c["type"]: c for c in deployment.get("status", {}).get("conditions", [])}
    available = conditions.get(AVAILABLE, {})
    progressing = conditions.get(PROGRESSING, {})
    failure = conditions.get(REPLICA_FAILURE, {})

    def of(c: dict[str, Any], state: str) -> tuple[str, str, str]:
        return state, c.get("reason", ""), c.get("message", "")

    ready = ("False", "", "")
    if available.get("status") == "True":
        ready = of(available, "True")
    if progressing.get("status") == "False":
        if progressing.get("message"):  # "we assume there was a problem" (the deadline)
            ready = of(progressing, "False")
    elif progressing.get("status") == "True":
        if progressing.get("reason") == "NewReplicaSetAvailable":
            ready = of(progressing, "True")
        elif available.get("status") != "True":
            ready = of(progressing, "Unknown")
    if available.get("status") == "False":
        ready = of(available, "False")
    if failure.get("status") == "True":
        ready = of(failure, "False")
    component = status.setdefault("components", {}).setdefault("predictor", {})
    if ready[0] == "True":
        component["url"] = url
    Conditions(status).set(PREDICTOR_READY, *ready)
    status["observedGeneration"] = deployment.get("status", {}).get("observedGeneration", 0)


def update_model_revision_states(status: dict[str, Any], state: str,
                                 failure: dict[str, Any] | None = None) -> None:  # fmt: skip
    """UpdateModelRevisionStates: the target state, the transition it implies, the failure."""
    model = status.setdefault("modelStatus", {})
    states = model.setdefault("states", {"activeModelState": ""})
    states["targetModelState"] = state
    if state in ("Pending", "Loading"):
        model["transitionStatus"] = "InProgress"
    elif state == "Loaded":
        model["transitionStatus"] = "UpToDate"
        states["activeModelState"] = "Loaded"
    elif state == "FailedToLoad":
        model["transitionStatus"] = "BlockedByFailedLoad"
    if failure is not None:
        set_model_failure_info(status, failure)


def update_model_transition_status(status: dict[str, Any], transition: str,
                                   failure: dict[str, Any] | None = None) -> None:  # fmt: skip
    """UpdateModelTransitionStatus: an invalid spec's model is FailedToLoad."""
    model = status.setdefault("modelStatus", {})
    model["transitionStatus"] = transition
    if transition == "InvalidSpec":
        model.setdefault("states", {"activeModelState": ""})["targetModelState"] = "FailedToLoad"
    if failure is not None:
        set_model_failure_info(status, failure)


def set_model_failure_info(status: dict[str, Any], failure: dict[str, Any]) -> None:
    """SetModelFailureInfo, with FailureInfo's empty fields omitted as JSON omits them."""
    status["modelStatus"]["lastFailureInfo"] = {k: v for k, v in failure.items() if v}


def _failure(terminated: dict[str, Any]) -> dict[str, Any]:
    return {"reason": "ModelLoadFailed", "message": terminated.get("message", ""),
            "exitCode": terminated.get("exitCode", 0)}  # fmt: skip


def propagate_model_status(status: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """PropagateModelStatus for a raw deployment: the model's state from the first predictor
    pod (`pods` are core/v1 PodStatus dicts). False: requeue (a storage initializer running
    again after a failure)."""
    ready_copies = sum(
        p.get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("conditions", []))
        for p in pods
    )
    copies = status.setdefault("modelStatus", {}).setdefault("copies", {"failedCopies": 0})
    copies["totalCopies"] = ready_copies
    if not copies["totalCopies"]:
        del copies["totalCopies"]  # omitempty
    if not pods:
        update_model_revision_states(status, "Pending")
        return True
    for cs in pods[0].get("initContainerStatuses", []):
        if cs["name"] != STORAGE_INITIALIZER:
            continue
        state, last = cs.get("state", {}), cs.get("lastState", {})
        if "running" in state:
            if "terminated" in last:
                return False
            update_model_revision_states(status, "Loading")
            return True
        if state.get("terminated", {}).get("reason") == "Error":
            update_model_revision_states(status, "FailedToLoad", _failure(state["terminated"]))
            return True
        if state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            update_model_revision_states(status, "FailedToLoad", _failure(last["terminated"]))
            return True
    if Conditions(status).is_true(READY):
        update_model_revision_states(status, "Loaded")
        return True
    for cs in pods[0].get("containerStatuses", []):
        if cs["name"] != KSERVE_CONTAINER:
            continue
        state, last = cs.get("state", {}), cs.get("lastState", {})
        if state.get("terminated", {}).get("reason") == "Error":
            update_model_revision_states(status, "FailedToLoad", _failure(state["terminated"]))
        elif state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            update_model_revision_states(status, "FailedToLoad", _failure(last["terminated"]))
        else:
            update_model_revision_states(status, "Pending")
    return True


def predictor_service_name(name: str) -> str:
    """pkg/constants/constants.go PredictorServiceName: the predictor's Service and Deployment."""
    return f"{name}-predictor"


def domain_name(name: str, namespace: str) -> str:
    """GenerateDomainName with the default template `{{ .Name }}-{{ .Namespace }}.{{
    .IngressDomain }}`; ValueError where apimachinery's IsFullyQualifiedDomainName refuses it
    (every label a DNS-1123 label of at most 63 characters)."""
    host = f"{name}-{namespace}.{INGRESS_DOMAIN}"
    for label in host.split("."):
        if len(label) > 63:
            raise ValueError(f'invalid domain name "{host}": url: Invalid value: "{label}": '
                             "must be no more than 63 characters")  # fmt: skip
    return host


def service_host(name: str, namespace: str) -> str:
    """getRawServiceHost: the predictor Service's cluster DNS name."""
    return f"{predictor_service_name(name)}.{namespace}.svc.{CLUSTER_DOMAIN}"


def reconcile_ingress(status: dict[str, Any], name: str, namespace: str) -> None:
    """RawIngressReconciler.Reconcile (no transformer or explainer; a ClusterIP Service): until
    PredictorReady is True, IngressReady False and no URL; then the Ingress, `status.url` (the
    top-level host) and `status.address.url` (the predictor Service in the cluster), IngressReady
    True."""
    conditions = Conditions(status)
    if not conditions.is_true(PREDICTOR_READY):
        conditions.set(INGRESS_READY, "False", "Predictor ingress not created")
        return
    status["url"] = f"{URL_SCHEME}://{domain_name(name, namespace)}"
    status["address"] = {"url": f"http://{service_host(name, namespace)}"}
    conditions.set(INGRESS_READY, "True")
