"""KServe's admission of an InferenceService, the part of it that applies to this project's.

kserve/kserve at v0.20.0 (the version whose CRDs `../shared/kserve-crds/v0.20.0/` holds), as a
pure function of the InferenceService; the API server checks the CRD's schema first:
- `pkg/apis/serving/v1beta1/inference_service_validation.go` (webhook
  `inferenceservice.kserve-webhook-server.validator`, failurePolicy Fail): the name matches
  `IsvcNameFmt` (`[a-z]([-a-z0-9]*[a-z0-9])?`, `InvalidISVCNameFormatError` of component.go);
  the `serving.kserve.io/autoscalerClass` annotation, when set, is one of
  `AutoscalerAllowedClassList` (pkg/constants/constants.go: hpa, external, keda, none); no
  container sets a blocked variable (`pkg/validation/env_policy.go`, `DefaultBlockedEnvVars`:
  PYTHONPATH); a standard predictor's `model` has no `name` (`validatePredictor`); the predictor
  has exactly one implementation (component.go `validateExactlyOneImplementation`, counting
  predictor.go `GetImplementations`: the framework fields, `model`, and custom containers).
- `pkg/controller/v1beta1/inferenceservice/utils/utils.go` `ValidateStorageURI`, which the
  controller applies before it creates anything: a storageUri with a scheme uses one of
  `SupportedStorageURIPrefixList`; and `pkg/utils/storage.go` `ParsePvcURI`: `pvc://<claim>/<path>`
  mounts `<path>` of claim `<claim>` at /mnt/models (storage_initializer_injector.go).

Fields of the predictor this model does not look at (transformers, explainers, worker specs,
canaries, storageUris, multi-model serving) are refused as not modelled, so that nothing passes
here unchecked.
"""

from __future__ import annotations

import re
from typing import Any

ISVC_NAME_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
INVALID_NAME = (
    'the InferenceService "{name}" is invalid: a InferenceService name must consist of lower case '
    "alphanumeric characters or '-', and must start with alphabetical character. (e.g. "
    "\"my-name\" or \"abc-123\", regex used for validation is '{fmt}')"
)
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
AUTOSCALER_CLASSES = ("hpa", "external", "keda", "none")
BLOCKED_ENV = ("PYTHONPATH",)
FRAMEWORKS = ("xgboost", "pytorch", "triton", "sklearn", "tensorflow", "onnx", "pmml",
              "lightgbm", "paddle", "huggingface", "model")  # fmt: skip
# ExactlyOneErrorFor lists PredictorSpec's Go fields but the last (ComponentExtensionSpec).
PREDICTOR_FIELDS = ("Name, SKLearn, XGBoost, Tensorflow, PyTorch, Triton, ONNX, HuggingFace, "
                    "PMML, LightGBM, Paddle, Model, StorageUris, StorageContainerName, "
                    "WorkerSpec, PodSpec")  # fmt: skip
STORAGE_PREFIXES = ("gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://",
                    "webhdfs://", "oci://", "oci+native://", "hf://")  # fmt: skip
UNSUPPORTED_URI = (
    "storageUri, must be one of: [{prefixes}] or match "
    "https://{{}}.blob.core.windows.net/{{}}/{{}} or be an absolute or relative local path. "
    "StorageUri [{uri}] is not supported"
)
MODELLED_SPEC = {"predictor"}
MODELLED_PREDICTOR = {*FRAMEWORKS, "minReplicas", "maxReplicas", "serviceAccountName",
                      "nodeSelector", "tolerations"}  # fmt: skip


class Refused(Exception):
    """What KServe answers instead of creating the InferenceService."""


def admit(isvc: dict[str, Any]) -> None:
    """Raise Refused with KServe's message if v0.20.0 would refuse `isvc`."""
    name = isvc["metadata"]["name"]
    if not re.fullmatch(ISVC_NAME_FMT, name):
        raise Refused(INVALID_NAME.format(name=name, fmt=ISVC_NAME_FMT))
    annotations = isvc["metadata"].get("annotations") or {}
    if AUTOSCALER_CLASS in annotations and annotations[AUTOSCALER_CLASS] not in AUTOSCALER_CLASSES:
        raise Refused(f"[{annotations[AUTOSCALER_CLASS]}] is not a supported autoscaler class type")
    spec = isvc["spec"]
    if unmodelled := set(spec) - MODELLED_SPEC:
        raise Refused(f"not modelled: spec.{sorted(unmodelled)[0]}")
    predictor = spec["predictor"]
    if unmodelled := set(predictor) - MODELLED_PREDICTOR - {"containers"}:
        raise Refused(f"not modelled: spec.predictor.{sorted(unmodelled)[0]}")
    containers = predictor.get("containers") or []
    for c in [*containers, *(predictor[f] for f in FRAMEWORKS if f in predictor)]:
        for env in c.get("env") or []:
            if env["name"] in BLOCKED_ENV:
                raise Refused(
                    f'the InferenceService "{name}" is invalid: setting {env["name"]} in container '
                    f'"{c.get("name", "")}" is not allowed for security reasons'
                )
    if (predictor.get("model") or {}).get("name"):
        raise Refused("the 'name' field is not allowed in standard predictor")
    if len([f for f in FRAMEWORKS if f in predictor]) + bool(containers) != 1:
        raise Refused(f"exactly one of [{PREDICTOR_FIELDS}] must be specified in PredictorSpec")
    for f in FRAMEWORKS:
        uri = (predictor.get(f) or {}).get("storageUri")
        if uri and re.match(r"\w+?://", uri) and not uri.startswith(STORAGE_PREFIXES):
            raise Refused(UNSUPPORTED_URI.format(prefixes=", ".join(STORAGE_PREFIXES), uri=uri))


def pvc_mount(uri: str) -> tuple[str, str]:
    """(claim, path in it) that `pvc://<claim>/<path>` mounts at /mnt/models (ParsePvcURI)."""
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path
