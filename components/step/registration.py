"""train-gpt's model in Kubeflow's Model Registry, once its TrainJob has completed.

A run is a version of a registered model: the model's name (`model_name`, by default the run's),
the version named after the run, its model artifact the run's export (the `s3://` or `gs://`
copy where `export_uri` made one, else the run's `model/` on PVC gpt-pvc as KServe names it,
`pvc://gpt-pvc/<run>/model`), in the format KServe's Hugging Face runtime serves (`huggingface`
version 1: a Hugging Face directory of safetensors weights), with what the run was
(architecture, parameters, tokenizer, validation bits per byte, `init_from`, the KFP run) as the
version's metadata and the KFP run as the artifact's model source (the registry's fields for
where a model came from: kind `kfp`, class `pipelinerun`, the namespace, the run id). The
`model-registry` client from PyPI does the talking (kubeflow/model-registry `clients/python`,
imported only when a registry is named); what it sends is tested against the registry's OpenAPI
spec (tests/kfp_components/step/test_registration.py).

Pure functions of the run's carried files, like components/step/artifacts.py, and one call to
the registry; a registry that refuses or cannot be reached is one line, `RegistrationError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlparse

from components.step import context
from components.step.artifacts import REPORT_MD, train_metrics, train_provenance
from components.step.dispatch import StepResult
from components.trainjob.claims import CLAIM
from gpt.rundir.layout import RunDir

MODEL_CONFIG = RunDir.model_config.rel
# A Hugging Face model directory (safetensors weights), as KServe's Hugging Face ServingRuntime
# names the format it serves (`supportedModelFormats`): what a deployment from the registry's
# entry picks the runtime by.
MODEL_FORMAT, MODEL_FORMAT_VERSION = "huggingface", "1"
# A registration is a handful of small calls; one that has no answer in this long finds the
# registry unreachable, where the client alone would wait 5 minutes a request.
CALL_TIMEOUT_S = 60.0


class RegistrationError(RuntimeError):
    """The registry refused the model or could not be reached: one line naming it and why."""


@dataclass(frozen=True)
class Registration:
    """Where train-gpt registers the run's model once training is done: the step's own knobs."""

    model_registry: str = ""
    """Kubeflow Model Registry's REST address to register the trained model in, e.g.
    http://model-registry-service.kubeflow.svc.cluster.local:8080 (https:// with the step's
    service-account token); empty: no registration."""
    model_name: str = ""
    """Name of the registered model the run becomes a version of (the version is named after
    the run); empty: the run's name. Runs given one name are versions of one model."""

    def __post_init__(self) -> None:
        # Checked when the component starts, before its TrainJob: not after hours of training.
        url = urlparse(self.model_registry)
        if self.model_registry and (url.scheme not in ("http", "https") or not url.hostname):
            raise ValueError(f"model_registry {self.model_registry!r}: not an http:// or "
                             "https:// address")  # fmt: skip

    @classmethod
    def take(cls, knobs: dict[str, Any]) -> Registration:
        """Remove this class's knobs from a component's `knobs` and return them."""
        return cls(**{f.name: knobs.pop(f.name) for f in fields(cls) if f.name in knobs})


@dataclass(frozen=True)
class ModelEntry:
    """What the registry is told about one run's model."""

    name: str
    version: str
    uri: str
    metadata: dict[str, str | int | float]
    kfp_run: str
    """The KFP run that trained it: the artifact's model source id."""
    namespace: str
    """The run's namespace: the model source's group (empty outside a cluster)."""


def model_uri(run: str, *, export_uri: str, backend: str, root: str) -> str:
    """Where the run's model is: its object-store export, else the run's model/ directory (on
    the PVC for a TrainJob, KServe's `pvc://<claim>/<path>`; a local folder otherwise)."""
    if export_uri:
        return export_uri
    if backend == "trainjob":
        return f"pvc://{CLAIM}/{run}/{RunDir.model_dir.rel}"
    return RunDir.of(root, run).model_dir.resolve().as_uri()


def _report_row(report: str, key: str) -> str:
    """A row of report.md's summary table (gpt/training/report.py writes `| key | value |`)."""
    found = re.search(rf"^\| {re.escape(key)} \| (.*) \|$", report, re.MULTILINE)
    return found.group(1) if found else ""


def run_metadata(files: dict[str, bytes], kfp_run: str) -> dict[str, str | int | float]:
    """What the run was, from its carried files: the architecture (model/config.json's), the
    parameters and tokenizer (report.md's), validation bits per byte (train.jsonl's), what it
    was fine-tuned from (init_from.json's) and the KFP run."""
    config = json.loads(files[MODEL_CONFIG]) if MODEL_CONFIG in files else {}
    report = files.get(REPORT_MD, b"").decode()
    parameters = re.match(r"([\d.]+[KMB]?) parameters", _report_row(report, "model"))
    tokenizer = re.match(r"(.+?) tokenizer\b", _report_row(report, "data"))
    found: dict[str, str | int | float | None] = {
        "architecture": (config.get("architectures") or [None])[0],
        "model_type": config.get("model_type"),
        "context": config.get("n_positions", config.get("max_position_embeddings")),
        "vocab_size": config.get("vocab_size"),
        "parameters": parameters.group(1) if parameters else None,
        "tokenizer": tokenizer.group(1) if tokenizer else None,
        "val_bits_per_byte": train_metrics(files).get("val_bits_per_byte"),
        **train_provenance(files),
        "kfp_run": kfp_run,
    }
    return {key: value for key, value in found.items() if value not in (None, "")}


def model_entry(files: dict[str, bytes], registration: Registration, *, run: str, kfp_run: str,
                namespace: str, uri: str) -> ModelEntry:  # fmt: skip
    """The registry's entry for run `run` (its carried `files`), stored at `uri`."""
    return ModelEntry(name=registration.model_name or run, version=run, uri=uri,
                      metadata=run_metadata(files, kfp_run), kfp_run=kfp_run,
                      namespace=namespace)  # fmt: skip


def _connect(address: str, runner: asyncio.Runner) -> Any:
    """The client for `address` (an http:// or https:// URL, `Registration` checked it),
    running its calls on `runner`'s loop, each within CALL_TIMEOUT_S."""
    from model_registry import ModelRegistry

    url = urlparse(address)
    secure = url.scheme == "https"
    port = url.port or (443 if secure else 80)

    # Our own loop, not the client's default (nest_asyncio2 patching asyncio for the whole
    # process), and a bound on each call: the client's is 5 minutes a request, retried.
    def run(call: Coroutine[Any, Any, Any]) -> Any:
        return runner.run(asyncio.wait_for(call, CALL_TIMEOUT_S))

    # The client sends the step's service-account token where the pod has one (its default,
    # /var/run/secrets/kubernetes.io/serviceaccount/token, or KFP's KF_PIPELINES_SA_TOKEN_PATH);
    # https:// needs it, http:// goes on without it (a local run), so the client's warning that
    # it is missing is not ours to say.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "User access token is missing")
        return ModelRegistry(f"{url.scheme}://{url.hostname}", port, author="gpt-trainjobs",
                             is_secure=secure, log_level=logging.ERROR, async_runner=run)


def register(address: str, entry: ModelEntry) -> str:
    """Register `entry` in the registry at `address`; what it did, in one line. A version of
    that name already there (a retried step) is left as it is."""
    try:
        with asyncio.Runner() as runner:
            registry = _connect(address, runner)
            registered = registry.get_registered_model(entry.name) is not None
            if registered and registry.get_model_version(entry.name, entry.version) is not None:
                return (f"model registry {address}: {entry.name} version {entry.version} was "
                        "already registered; left as it is")
            registry.register_model(
                entry.name, entry.uri, version=entry.version, model_format_name=MODEL_FORMAT,
                model_format_version=MODEL_FORMAT_VERSION, metadata=entry.metadata,
                version_description=f"trained by KFP run {entry.kfp_run}",
                # Where the model came from: a KFP pipeline run, by namespace and id.
                model_source_kind="kfp", model_source_class="pipelinerun",
                model_source_group=entry.namespace or None, model_source_id=entry.kfp_run,
                model_source_name=entry.version,
            )  # fmt: skip
    except Exception as e:  # the client's and aiohttp's errors: refusals, no connection
        raise RegistrationError(f"model registry {address}: {_reason(e)}") from None
    return (f"model registry {address}: registered {entry.name} version {entry.version} "
            f"({entry.uri})")


def _reason(e: Exception) -> str:
    """An error of the client or its HTTP library in one line: the HTTP status and the
    registry's own message where it answered, else the connection's error."""
    status, body = getattr(e, "status", None), getattr(e, "body", None)
    if status:
        try:
            message = json.loads(body or "{}").get("message") or ""
        except ValueError:
            message = str(body or "")
        why = " ".join(f"{message or getattr(e, 'reason', '') or ''}".split())
        return f"refused (HTTP {status}{': ' + why if why else ''})"
    if isinstance(e, TimeoutError):
        return f"unreachable: no answer within {CALL_TIMEOUT_S:g} s"
    text = " ".join(str(e).split()) or type(e).__name__
    # aiohttp's connection errors and timeouts are OSErrors; the rest is the client's own
    # (a missing token for https://, a store error)
    return f"{'unreachable' if isinstance(e, OSError) else 'failed'}: {text}"


def register_run(registration: Registration, step: StepResult, knobs: Mapping[str, Any],
                 say: Callable[[str], None] = print) -> ModelEntry:  # fmt: skip
    """What train-gpt's component does after its stage: register the run `step` trained with
    the step's other `knobs` (backend, root, namespace, export_uri) in `registration`'s
    registry, saying so in one line; raises RegistrationError."""
    backend = knobs["backend"]
    namespace = context.namespace(knobs["namespace"]) if backend == "trainjob" else ""
    # The KFP run: the step pod's label (compiled pipeline, components/step/context.py), else
    # (kfp.local, a direct call) the run, which is named after the KFP run by default.
    kfp_run = os.environ.get(context.RUN_ID_ENV) or step.run_id
    uri = model_uri(step.run_id, export_uri=knobs["export_uri"], backend=backend,
                    root=knobs["root"])  # fmt: skip
    entry = model_entry(step.files, registration, run=step.run_id, kfp_run=kfp_run,
                        namespace=namespace, uri=uri)  # fmt: skip
    say(register(registration.model_registry, entry))
    return entry
