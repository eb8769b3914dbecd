"""A run's KServe InferenceService: its name, the object, and its server-side apply.

The object is what `manifests/serve/` holds for a person to apply by hand, made by the deploy
step: KServe's Hugging Face runtime (`modelFormat: huggingface`, picked by the runtime's
`supportedModelFormats`), the model from `pvc://gpt-pvc/<run>/model` (mounted read-only at
/mnt/models) or from the run's `s3://` export (downloaded by KServe's storage initializer, with
the credentials of the predictor's ServiceAccount: KServe's S3 convention). On CPU the
transformers backend (`--backend=huggingface`, float32); where GPUs are requested, the runtime's
own default, vLLM.

The name is the run's, `gpt-<run>`, within what KServe v0.20.0 derives from it in raw
deployment (kserve/kserve at v0.20.0):
- the predictor's pods and Service carry the label `app: isvc.<name>-predictor`
  (`pkg/constants/constants.go` GetRawServiceLabel and PredictorServiceName;
  `reconcilers/deployment/deployment_reconciler.go`, `reconcilers/service/service_reconciler.go`),
  a label value of at most 63 characters: a name of at most 48;
- the predictor's URL is `<name>-predictor` through the ingress domain template, by default
  `{{ .Name }}-{{ .Namespace }}.{{ .IngressDomain }}` (`pkg/apis/serving/v1beta1/configmap.go`
  DefaultDomainTemplate; `reconcilers/raw/raw_kube_reconciler.go` createRawURL,
  `reconcilers/ingress/domain.go` GenerateDomainName), which must be a fully qualified domain
  name whose every label is a DNS-1123 label of at most 63 characters, else the reconcile fails:
  a name of at most 52 - len(namespace).
A run id longer than that, or not already a DNS label, keeps a readable prefix and gains 8 hex
of its sha256: one run, one name (a re-run applies the same service); two runs, two names.

The apply is what `kubectl apply --server-side` and the kubernetes client's
`DynamicClient.server_side_apply` send: PATCH with `application/apply-patch+yaml`, a field
manager, forced (the step owns every field it writes; fields others set stay theirs).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from components.trainjob.launcher import PART_OF, RUN_LABEL, label_value

GROUP = "serving.kserve.io"
VERSION, KIND = "v1beta1", "InferenceService"
PLURAL = "inferenceservices"
# The InferenceService's field manager: `kubectl get isvc --show-managed-fields` shows it.
FIELD_MANAGER = "gpt-trainjobs"
NAME_PREFIX = "gpt-"
# kserve v0.20.0 pkg/apis/serving/v1beta1/component.go IsvcNameFmt
ISVC_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63
# `app: isvc.<name>-predictor`, a label value: at most 63 characters.
NAME_MAX = DNS_LABEL_MAX - len("isvc.") - len("-predictor")
# `<name>-predictor-<namespace>`, the first label of the predictor's host.
HOST_LABEL_OVERHEAD = len("-predictor-")
HASH_HEX = 8
SHORTEST = len(NAME_PREFIX) + HASH_HEX
# The server's flags (kserve v0.20.0 python/huggingfaceserver/huggingfaceserver/__main__.py,
# `--backend` auto, vllm or huggingface): transformers on CPU, in float32; on a GPU the default,
# auto, which is vLLM where it is installed (the runtime's image has it).
CPU_ARGS = ["--backend=huggingface", "--dtype=float32"]
# As manifests/serve/inferenceservice.yaml asks.
CPU_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"},
                 "limits": {"cpu": "2", "memory": "4Gi"}}  # fmt: skip


class ServingError(RuntimeError):
    """The InferenceService could not be applied, did not become Ready, or did not answer: one
    line naming it, KServe's (or the API server's) reason and what to do."""


def name_limit(namespace: str) -> int:
    """The longest InferenceService name KServe v0.20.0 serves in `namespace` (module text)."""
    return min(NAME_MAX, DNS_LABEL_MAX - HOST_LABEL_OVERHEAD - len(namespace))


def service_name(run: str, namespace: str) -> str:
    """`gpt-<run>`, or `gpt-<prefix of run>-<8 hex of its sha256>` where the run is longer than
    KServe allows in `namespace` or is not already lower-case letters, digits and '-'."""
    limit = name_limit(namespace)
    if limit < SHORTEST:
        raise ValueError(
            f"namespace {namespace!r}: {len(namespace)} characters leave no room for an "
            f"InferenceService name (KServe's predictor host `<name>-predictor-<namespace>` is "
            f"one DNS label of at most {DNS_LABEL_MAX} characters)"
        )
    plain = f"{NAME_PREFIX}{run}"
    if len(plain) <= limit and ISVC_NAME.fullmatch(plain):
        return plain
    digest = hashlib.sha256(run.encode()).hexdigest()[:HASH_HEX]
    readable = re.sub(r"[^a-z0-9]+", "-", run.lower()).strip("-")
    prefix = f"{NAME_PREFIX}{readable}"[: limit - HASH_HEX - 1].rstrip("-")
    return f"{prefix}-{digest}"


@dataclass(frozen=True)
class Predictor:
    """What the predictor serves and on what."""

    storage_uri: str
    """pvc://<claim>/<path> or s3://<bucket>/<prefix>: the run's model/ directory."""
    gpus: int = 0
    """NVIDIA GPUs for the predictor; 0: CPU, transformers."""
    service_account: str = ""
    """The predictor's ServiceAccount (its Secret's S3 credentials); empty: the namespace's."""


def build_inferenceservice(name: str, namespace: str, run: str,
                           predictor: Predictor) -> dict[str, Any]:  # fmt: skip
    """The InferenceService object the step applies."""
    if predictor.gpus:
        args: list[str] = []
        resources = {"requests": {"cpu": "1", "memory": "8Gi"},
                     "limits": {"nvidia.com/gpu": str(predictor.gpus)}}  # fmt: skip
    else:
        args, resources = list(CPU_ARGS), CPU_RESOURCES
    model: dict[str, Any] = {
        "modelFormat": {"name": "huggingface"},
        "storageUri": predictor.storage_uri,
        "resources": json.loads(json.dumps(resources)),  # its own copy
    }
    if args:
        model["args"] = args
    spec: dict[str, Any] = {"model": model}
    if predictor.service_account:
        spec["serviceAccountName"] = predictor.service_account
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**PART_OF, RUN_LABEL: label_value(run)},
        },
        "spec": {"predictor": spec},
    }


def server_side_apply(api: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Create or update the InferenceService `body` (its apiVersion's group and version) by
    server-side apply (forced, FIELD_MANAGER); the object the server returned. `api` is a
    kubernetes `CustomObjectsApi` (its client: 30.x's `patch_namespaced_custom_object` sends
    only merge patches)."""
    meta = body["metadata"]
    group, version = body["apiVersion"].split("/")
    return api.api_client.call_api(
        "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", "PATCH",
        path_params={"group": group, "version": version, "namespace": meta["namespace"],
                     "plural": PLURAL, "name": meta["name"]},
        query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        header_params={"Accept": "application/json",
                       "Content-Type": "application/apply-patch+yaml"},
        body=body, response_type="object", auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )  # fmt: skip


def api_refusal(e: Exception, where: str) -> ServingError | None:
    """The API server's 404 (no KServe) or 403 (RBAC) on `where` as one line; None for
    anything else."""
    status = getattr(e, "status", None)
    if status not in (403, 404):
        return None
    try:
        message = json.loads(getattr(e, "body", None) or "{}").get("message") or ""
    except ValueError:
        message = ""
    message = " ".join(message.split())
    if status == 404:
        return ServingError(
            f"InferenceService {where}: the API server has no {GROUP}/{VERSION} "
            f"{PLURAL} (HTTP 404{': ' + message if message else ''}): KServe is not installed; "
            f"install KServe (its CRDs and controller) or run without serve"
        )
    return ServingError(
        f"InferenceService {where}: forbidden (HTTP 403: {message or 'no message'}): grant the "
        f"step's service account patch, get and watch on {PLURAL}.{GROUP} in the namespace "
        f"(manifests/standalone/rbac.yaml; in a profile namespace default-editor has them)"
    )
