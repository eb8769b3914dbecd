"""train-gpt's KFP `Model` artifact: where the run's model is and what it is, in the run's lineage.

The artifact is a small JSON record, `model.json`, at the URI KFP gives it; its metadata (what
KFP's UI and ML Metadata show) says the same: `model_uri`, where the model is (the run's
`s3://` export, else `pvc://gpt-pvc/<run>/model`, or the local folder with the local backend),
its format (KServe's `huggingface`) and what the run was (components/step/registration.py's
`run_metadata`: architecture, parameters, tokenizer, validation bits per byte, `init_from`, the
KFP run; and the run).

Why the model's location is in the record and not the artifact's own URI: KFP's launcher
uploads every output artifact from its local path to the URI the component leaves on it, and
refuses a URI outside the pipeline root's bucket (kubeflow/pipelines 2.17.0
`backend/src/v2/component/launcher_v2.go` uploadOutputArtifacts, `backend/src/v2/objectstore/
config.go` KeyFromURI: "does not have expected bucket prefix"), so an `s3://` export's URI would
fail the step after training.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from components.step import context
from components.step.dispatch import StepResult
from components.step.registration import MODEL_FORMAT, MODEL_FORMAT_VERSION, model_uri, run_metadata


def model_record(step: StepResult, knobs: Mapping[str, Any]) -> dict[str, str | int | float]:
    """The artifact's metadata for the run `step` trained with the step's `knobs` (backend,
    root, export_uri)."""
    kfp_run = os.environ.get(context.RUN_ID_ENV) or step.run_id
    uri = model_uri(step.run_id, export_uri=knobs["export_uri"], backend=knobs["backend"],
                    root=knobs["root"])  # fmt: skip
    return {"model_uri": uri, "model_format": MODEL_FORMAT,
            "model_format_version": MODEL_FORMAT_VERSION, "run": step.run_id,
            **run_metadata(step.files, kfp_run)}  # fmt: skip


def write_model_artifact(model: Any, step: StepResult, knobs: Mapping[str, Any]) -> None:
    """Fill KFP's output `model` (a dsl.Model): its record and metadata."""
    record = model_record(step, knobs)
    model.metadata.update(record)
    with open(model.path, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
