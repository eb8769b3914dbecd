"""KServe v0.20.0's InferenceService controller in raw-deployment (`Standard`, v0.20's default)
mode, for one namespace of the test API server; its predictor runs KServe's own server
(cluster/predictor.py).

kserve/kserve at v0.20.0, `pkg/controller/v1beta1/inferenceservice/`:
- `controller.go` (Reconcile): the finalizer `inferenceservice.finalizers` added first (merge
  patch) and, once the InferenceService is being deleted, its resources deleted and the
  finalizer removed; the conditions initialized (Ready, PredictorReady, IngressReady Unknown);
  the predictor reconciled; on its error the status written as it stands and the request
  requeued (controller-runtime's default back-off: 5 ms doubling to 1000 s), a Warning Event
  `InternalError` with the error (cluster/events.py `CoreEventRecorder`); on its
  RequeueAfter (a storage initializer running again after a failure) nothing written, another
  reconcile a second later; else `Stopped` False, the ingress (kserve_status.py
  `reconcile_ingress`) and the status written (`updateStatus`: with `deploymentMode`, only when
  it changed; then an Event where Ready turned True, InferenceServiceReady, or from True to
  False, InferenceServiceNotReady naming the False conditions). A reconcile follows any change
  of the InferenceService (its own status updates included: `For` without predicates), of its
  Deployment (`Owns`), and of its pods' init container statuses (`podInitContainersPredicate`);
  not a container's crash alone, which changes neither (the model's failure then shows at the
  next of those, at the latest when the Deployment's progress deadline passes);
- `components/predictor.go` (Reconcile, reconcileModel, buildPodSpec, reconcileRawDeployment):
  the runtime named by `model.runtime` (a ServingRuntime of the namespace, else a
  ClusterServingRuntime; none: RuntimeNotRecognized) or the first that supports the model
  (`predictor_model.go` GetSupportingRuntimes: enabled, single-model, no workerSpec, the model's
  protocol (v1 unless set), a `supportedModelFormats` entry with `autoSelect` of the model's
  name (and version, when the model gives one); the namespace's before the cluster's, each by
  priority; none: NoSupportingRuntime), each failure a `modelStatus` of transition InvalidSpec
  with lastFailureInfo; `status.clusterServingRuntimeName` (or `servingRuntimeName`); the
  runtime's `kserve-container` merged with the model's container (`utils.go`
  MergeRuntimeContainers: args appended to the runtime's, env by name, the model's resources
  over the runtime's), `{{.Name}}` and `{{.Namespace}}` replaced (ReplacePlaceholders),
  INFERENCE_SERVICE_NAME added; the Deployment and Service `<name>-predictor`, the component's
  URL `http://<name>-predictor-<namespace>.example.com` (raw_kube_reconciler.go createRawURL,
  whose domain check fails the reconcile, ReconcileFailed, for a name too long); then
  PropagateRawStatus and PropagateModelStatus (kserve_status.py).

Not modelled: the mutating webhook's defaults, transformers, explainers, canaries, multi-node,
autoscalers, Knative, the InferenceService ConfigMap (its defaults are used). The
storage initializer's S3 credentials come from the predictor's ServiceAccount and its Secrets
(cluster/kserve_credentials.py), which a test gives as `service_accounts` and `secrets`.
What KServe's validating webhook would have refused (cluster/kserve_webhook.py) never reaches a
controller: here it is an error of the test cluster.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.cluster.events import CoreEventRecorder
from support.cluster.kserve_credentials import storage_env
from support.cluster.kserve_status import (
    CLUSTER_DOMAIN,
    READY,
    STOPPED,
    Conditions,
    domain_name,
    predictor_service_name,
    propagate_model_status,
    propagate_raw_status,
    propagate_raw_status_with_messages,
    reconcile_ingress,
    service_host,
    update_model_transition_status,
)
from support.cluster.kserve_webhook import Refused, admit, pvc_mount
from support.cluster.predictor import Deployment, PodTemplate

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
RUNTIME_VERSION = "v1alpha1"
FINALIZER = "inferenceservice.finalizers"
DEPLOYMENT_MODE = "Standard"
KSERVE_CONTAINER = "kserve-container"
INFERENCE_SERVICE_NAME = "INFERENCE_SERVICE_NAME"
POLL_S = 0.05
EVENT_SOURCE = "v1beta1Controllers"  # cmd/manager/main.go: the recorder's component
REQUEUE_BASE_S, REQUEUE_MAX_S = 0.005, 1000.0


class ReconcileError(Exception):
    """What the reconcile returns as its error (the status already says what KServe says)."""


class KServe(threading.Thread):
    """Plays KServe's InferenceService controller for one namespace."""

    def __init__(self, api: Any, namespace: str, claims: Callable[[str, str], Path | None],
                 pods: Path, python: Path, *, events: Path | None = None,
                 images: set[str] | None = None,
                 probe_period_s: float = 1.0, backoff_s: float = 2.0,
                 progress_deadline_s: float = 600.0):  # fmt: skip
        """`claims(namespace, name)`: the folder that is that PVC (None: no such claim);
        `pods`: where the predictor pods' folders and logs go; `python`: the Hugging Face
        server's virtualenv's; `events`: the folder of the namespaces' Events (the kubelet's
        logs, which `LogDirEvents` reads; None: `pods`); the rest as cluster/predictor.py
        says."""
        super().__init__(daemon=True, name=f"kserve-{namespace}")
        self.api, self.namespace, self.claims, self.pods = api, namespace, claims, pods
        self.python, self.images = python, images
        self.probe_period_s, self.backoff_s = probe_period_s, backoff_s
        self.progress_deadline_s = progress_deadline_s
        self.service_accounts: dict[str, dict[str, Any]] = {}
        """The namespace's ServiceAccounts by name, as objects (the API server has no core API;
        cluster/kserve_credentials.py reads them)."""
        self.secrets: dict[str, dict[str, Any]] = {}
        """The namespace's Secrets by name, as objects."""
        self.deployments: dict[str, Deployment] = {}
        self.recorder = CoreEventRecorder(events or pods, EVENT_SOURCE)
        self.errors: list[BaseException] = []
        """What went wrong in the test cluster itself (the test fails on it)."""
        self._seen: dict[str, Any] = {}
        self._requeue: dict[str, tuple[float, float]] = {}
        """name -> (when, the back-off after it) for a reconcile that failed or asked again."""
        self._stopping = threading.Event()
        self.start()

    # ---- what a test reads -----------------------------------------------------------------

    def address(self, host: str) -> int | None:
        """The local port that a cluster host name of this namespace's predictors reaches: the
        predictor Service (`<name>-predictor.<ns>.svc[.cluster.local]`) or the Ingress's host
        (`<name>-<ns>.example.com`), routed to a ready pod; None while none is ready; KeyError
        for a host that is neither."""
        for name, deployment in list(self.deployments.items()):
            full = service_host(name, self.namespace)
            hosts = {full, full.removesuffix(f".{CLUSTER_DOMAIN}")}
            with contextlib.suppress(ValueError):
                hosts.add(domain_name(name, self.namespace))
            if host in hosts:
                ready = [p for p in deployment.pods if p.ready]
                return ready[-1].http_port if ready else None
        raise KeyError(host)

    def predictor(self, name: str) -> Deployment:
        return self.deployments[name]

    # ---- the controller ----------------------------------------------------------------------

    def run(self) -> None:
        while not self._stopping.wait(POLL_S):
            try:
                self._sync_all()
            except BaseException as e:  # noqa: BLE001  (surfaced by the test)
                if self._stopping.is_set():
                    return
                self.errors.append(e)
                print(f"test cluster: KServe in {self.namespace}: {e!r}")
                return

    def _sync_all(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            items = self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                           PLURAL)["items"]  # fmt: skip
        except ApiException as e:
            if e.status == 404:  # no InferenceService CRD: nothing to watch
                return
            raise
        names = {i["metadata"]["name"] for i in items}
        for name in [n for n in self.deployments if n not in names]:
            self.deployments.pop(name).delete()  # the garbage collector's part
        for gone in (self._seen, self._requeue):
            for name in [n for n in gone if n not in names]:
                del gone[name]
        for isvc in items:
            self._sync(isvc)
        for deployment in self.deployments.values():
            self.errors.extend(e for e in deployment.errors() if e not in self.errors)

    def _sync(self, isvc: dict[str, Any]) -> None:
        meta = isvc["metadata"]
        name = meta["name"]
        if meta.get("deletionTimestamp"):
            if name in self.deployments:
                self.deployments.pop(name).delete()
            if FINALIZER in (meta.get("finalizers") or []):
                rest = [f for f in meta["finalizers"] if f != FINALIZER]
                self._patch(name, {"metadata": {"finalizers": rest or None}})
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self._patch(name, {"metadata": {"finalizers": [*(meta.get("finalizers") or []),
                                                           FINALIZER]}})  # fmt: skip
            return  # the patch is a change: the next reconcile sees it
        deployment = self.deployments.get(name)
        watched = (meta["resourceVersion"],
                   json.dumps(deployment.sync()["status"]) if deployment else "",
                   json.dumps([p.get("initContainerStatuses") for p in
                               deployment.pod_statuses()]) if deployment else "")  # fmt: skip
        due = self._requeue.get(name, (float("inf"), 0))[0] <= time.monotonic()
        if watched == self._seen.get(name) and not due:
            return
        self._seen[name] = watched
        self._reconcile(isvc)

    def _reconcile(self, isvc: dict[str, Any]) -> None:
        name = isvc["metadata"]["name"]
        try:
            admit(isvc)
        except Refused as e:
            raise AssertionError(f"KServe's webhook would have refused InferenceService "
                                 f"{self.namespace}/{name}: {e}") from None  # fmt: skip
        status = copy.deepcopy(isvc.get("status") or {})
        # InferenceServiceStatus's ModelStatus is a struct, its transitionStatus without
        # omitempty: Go writes "" where nothing set it (the CRD's default never applies).
        status.setdefault("modelStatus", {}).setdefault("transitionStatus", "")
        conditions = Conditions(status)
        if conditions.get(READY) is None:
            conditions.initialize()
        try:
            again = self._reconcile_predictor(isvc, status)
        except ReconcileError as e:
            self.recorder.eventf(isvc, "Warning", "InternalError", str(e))
            _, backoff = self._requeue.get(name, (0, REQUEUE_BASE_S / 2))
            backoff = min(backoff * 2, REQUEUE_MAX_S)
            self._requeue[name] = (time.monotonic() + backoff, backoff)
        else:
            if again:  # Reconcile returns the RequeueAfter at once: no status written
                self._requeue[name] = (time.monotonic() + 1.0, REQUEUE_BASE_S / 2)
                return
            self._requeue.pop(name, None)
            if conditions.get(STOPPED) is None:
                conditions.set(STOPPED, "False")
            reconcile_ingress(status, name, self.namespace)
        status["deploymentMode"] = DEPLOYMENT_MODE
        if status != isvc.get("status") and self._write_status(isvc, status):
            self._readiness_event(isvc, status)

    def _readiness_event(self, isvc: dict[str, Any], status: dict[str, Any]) -> None:
        """updateStatus's Events once the status is written: Ready, or no longer Ready and
        which conditions are False (GetFailConditions)."""
        name = isvc["metadata"]["name"]
        was = (Conditions(isvc.get("status") or {}).get(READY) or {}).get("status")
        now = (Conditions(status).get(READY) or {}).get("status")
        if was == "True" and now == "False":
            failed = ", ".join(c["type"] for c in status["conditions"] if c["status"] == "False")
            self.recorder.eventf(isvc, "Warning", "InferenceServiceNotReady",
                                 f"InferenceService [{name}] is no longer Ready because of: "
                                 f"{failed}")  # fmt: skip
        elif was != "True" and now == "True":
            self.recorder.eventf(isvc, "Normal", "InferenceServiceReady",
                                 f"InferenceService [{name}] is Ready")

    def _reconcile_predictor(self, isvc: dict[str, Any], status: dict[str, Any]) -> bool:
        """Predictor.Reconcile; True where it asks to be requeued (RequeueAfter 1 s)."""
        name = isvc["metadata"]["name"]
        model = isvc["spec"]["predictor"].get("model")
        if model is None:
            raise AssertionError(f"{name}: a predictor other than `model` is not modelled")
        runtime = self._runtime(isvc, status)
        template = self._template(isvc, model, runtime)
        deployment_name = predictor_service_name(name)
        try:
            component_url = f"http://{domain_name(deployment_name, self.namespace)}"
        except ValueError as e:
            message = (f"fails to create NewRawKubeReconciler for predictor: failed creating "
                       f"host name: {e}")  # fmt: skip
            propagate_raw_status_with_messages(status, "ReconcileFailed", message)
            raise ReconcileError(message) from None
        deployment = self.deployments.get(name)
        if deployment is None:
            deployment = self.deployments[name] = Deployment(
                deployment_name, self.namespace, self.pods, self.python, self.images,
                self.probe_period_s, self.backoff_s, self.progress_deadline_s)  # fmt: skip
        deployment.apply(template)
        propagate_raw_status(status, deployment.sync(), component_url)
        return not propagate_model_status(status, deployment.pod_statuses())

    def _runtime(self, isvc: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """The serving runtime's spec (reconcileModel), its name in the status."""
        model = isvc["spec"]["predictor"]["model"]
        if model.get("runtime"):
            named = model["runtime"]
            found = self._named_runtime(named)
            if found is None:
                update_model_transition_status(status, "InvalidSpec", {
                    "reason": "RuntimeNotRecognized",
                    "message": "Waiting for runtime to become available"})  # fmt: skip
                raise ReconcileError("No ServingRuntimes or ClusterServingRuntimes with the "
                                     f"name: {named}")  # fmt: skip
            runtime, cluster = found
            checks = ((runtime["spec"].get("disabled"), "RuntimeDisabled",
                       "Specified runtime is disabled", "is disabled"),
                      (not _protocol_supported(runtime, model), "NoSupportingRuntime",
                       "Specified runtime does not support specified protocol version",
                       "does not support specified protocol version"),
                      (not _supports(runtime, model), "NoSupportingRuntime",
                       "Specified runtime does not support specified framework/version",
                       "does not support specified framework/version"))
            for failed, reason, message, error in checks:
                if failed:
                    update_model_transition_status(status, "InvalidSpec",
                                                   {"reason": reason, "message": message})
                    raise ReconcileError(f"specified runtime {named} {error}")
        else:
            supporting = self._supporting_runtimes(model)
            if not supporting:
                update_model_transition_status(status, "InvalidSpec", {
                    "reason": "NoSupportingRuntime",
                    "message": "No runtime found to support specified framework/version"})
                raise ReconcileError("no runtime found to support predictor with model type: "
                                     f"{_go_model_format(model)}")  # fmt: skip
            runtime, cluster = supporting[0]
        key = "clusterServingRuntimeName" if cluster else "servingRuntimeName"
        status[key] = runtime["metadata"]["name"]
        status.pop("servingRuntimeName" if cluster else "clusterServingRuntimeName", None)
        return runtime

    def _named_runtime(self, name: str) -> tuple[dict[str, Any], bool] | None:
        """isvcutils.GetServingRuntime: the namespace's ServingRuntime, else the cluster's."""
        from kubernetes.client.exceptions import ApiException

        for cluster in (False, True):
            try:
                if cluster:
                    return self.api.get_cluster_custom_object(
                        GROUP, RUNTIME_VERSION, "clusterservingruntimes", name), True
                return self.api.get_namespaced_custom_object(
                    GROUP, RUNTIME_VERSION, self.namespace, "servingruntimes", name), False
            except ApiException as e:
                if e.status != 404:
                    raise
        return None

    def _supporting_runtimes(self, model: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
        """GetSupportingRuntimes: the namespace's, then the cluster's, each newest first, then
        by name, then by the model format's priority (highest first)."""
        from kubernetes.client.exceptions import ApiException

        found = []
        for cluster in (False, True):
            try:
                items = (self.api.list_cluster_custom_object(
                             GROUP, RUNTIME_VERSION, "clusterservingruntimes") if cluster
                         else self.api.list_namespaced_custom_object(
                             GROUP, RUNTIME_VERSION, self.namespace, "servingruntimes"))["items"]
            except ApiException as e:
                if e.status != 404 or not cluster:  # no ClusterServingRuntime CRD: none
                    raise
                items = []
            items.sort(key=lambda r: r["metadata"]["name"])
            items.sort(key=lambda r: r["metadata"]["creationTimestamp"], reverse=True)
            usable = [r for r in items
                      if not r["spec"].get("disabled") and not r["spec"].get("multiModel")
                      and not r["spec"].get("workerSpec") and _supports(r, model)
                      and _protocol_supported(r, model)]  # fmt: skip
            usable.sort(key=lambda r: -_priority(r, model) if _priority(r, model) is not None
                        else float("inf"))  # fmt: skip
            found += [(r, cluster) for r in usable]
        return found

    def _template(self, isvc: dict[str, Any], model: dict[str, Any],
                  runtime: dict[str, Any]) -> PodTemplate:  # fmt: skip
        """The predictor pod, as buildPodSpec and the storage initializer injector make it."""
        meta = isvc["metadata"]
        container = next(c for c in runtime["spec"]["containers"] if c["name"] == KSERVE_CONTAINER)
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        env.update({e["name"]: e.get("value", "") for e in model.get("env") or []})
        env[INFERENCE_SERVICE_NAME] = meta["name"]
        args = [*(container.get("args") or []), *(model.get("args") or [])]
        args = [_placeholders(a, meta) for a in args]
        uri = model.get("storageUri", "")
        model_dir, unschedulable = None, ""
        if uri.startswith("pvc://"):
            claim, path = pvc_mount(uri)
            folder = self.claims(self.namespace, claim)
            if folder is None:
                unschedulable = (f'0/1 nodes are available: persistentvolumeclaim "{claim}" '
                                 "not found.")  # fmt: skip
            else:
                # The kubelet makes a subPath that is missing (subpath_linux.go doSafeMakeDir).
                model_dir = folder / path
                model_dir.mkdir(parents=True, exist_ok=True)
        else:
            env.update(storage_env(isvc, self.service_accounts, self.secrets))
        return PodTemplate(image=model.get("image") or container["image"], args=tuple(args),
                           env=tuple(sorted(env.items())), storage_uri=uri, model_dir=model_dir,
                           unschedulable=unschedulable)  # fmt: skip

    # ---- the API server -------------------------------------------------------------------

    def _patch(self, name: str, body: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, body)

    def _write_status(self, isvc: dict[str, Any], status: dict[str, Any]) -> bool:
        """Status().Update, False where it failed: a conflict (a newer InferenceService) is
        retried by the next reconcile, which that change brings."""
        from kubernetes.client.exceptions import ApiException

        body = {**isvc, "status": status}
        try:
            self.api.replace_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, isvc["metadata"]["name"], body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            return False
        return True

    def shutdown(self) -> None:
        """Stop watching and delete every predictor pod."""
        self._stopping.set()
        self.join(10)
        for deployment in self.deployments.values():
            deployment.delete()


def _placeholders(text: str, meta: dict[str, Any]) -> str:
    """ReplacePlaceholders: Go's template over the container with the InferenceService's
    ObjectMeta; only `{{.Name}}` and `{{.Namespace}}` are modelled."""
    text = text.replace("{{.Name}}", meta["name"]).replace("{{.Namespace}}", meta["namespace"])
    if "{{" in text:
        raise AssertionError(f"placeholder not modelled: {text}")
    return text


def _go_model_format(model: dict[str, Any]) -> str:
    """Go's `%v` of the model's ModelFormat{Name, Version *string}: `{huggingface <nil>}` (a
    version prints as its pointer, an address, here a stand-in)."""
    version = "0xc000010000" if model["modelFormat"].get("version") else "<nil>"
    return f"{{{model['modelFormat']['name']} {version}}}"


def _format_label(model: dict[str, Any]) -> str:
    fmt = model["modelFormat"]
    return f"mt:{fmt['name']}" + (f":{fmt['version']}" if fmt.get("version") else "")


def _supports(runtime: dict[str, Any], model: dict[str, Any]) -> bool:
    """RuntimeSupportsModel: the model format's label among the runtime's (autoSelect ones
    only, unless the model names its runtime)."""
    labels = set()
    for f in runtime["spec"].get("supportedModelFormats") or []:
        if model.get("runtime") or f.get("autoSelect"):
            labels.add(f"mt:{f['name']}")
            if f.get("version"):
                labels.add(f"mt:{f['name']}:{f['version']}")
    return _format_label(model) in labels


def _protocol_supported(runtime: dict[str, Any], model: dict[str, Any]) -> bool:
    """IsProtocolVersionSupported, for the model's protocol (GetProtocol: v1 unless set)."""
    versions = runtime["spec"].get("protocolVersions") or []
    return not versions or model.get("protocolVersion", "v1") in versions


def _priority(runtime: dict[str, Any], model: dict[str, Any]) -> int | None:
    for f in runtime["spec"].get("supportedModelFormats") or []:
        if f["name"] == model["modelFormat"]["name"]:
            return f.get("priority")
    return None
