"""A KFP step's pod, as a KFP backend makes it: what the step sees of its run and namespace.

- kubeflow/pipelines backend/src/apiserver/template/v2_template.go (2.2.0 to 2.5.0): every pod
  of a run is labelled `pipeline/runid: <run id>` (`SetPodMetadataLabels`, an Argo workflow's
  `spec.podMetadata`).
- backend/src/v2/driver/driver.go (2.2.0 on): a task's `fieldPathAsEnv` (the compiled
  pipeline's kubernetes platform spec) becomes an env var with `valueFrom.fieldRef`, which the
  kubelet resolves from the pod (cluster/kubelet.py `_env_value`).
- Before 2.5.0 the driver leaves `{{$.pipeline_job_uuid}}` in a task's input unresolved
  (driver.go resolves it only from 2.5.0 on, #11599): `unresolved_run_id` plays such a backend
  under kfp.local, which resolves it itself.

kfp.local runs every step in this process's environment and ignores the platform spec, so a
test sets `step_env(...)` there: the env a step's pod would have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from support.cluster.kubelet import _env_value

RUN_ID_LABEL = "pipeline/runid"
UNRESOLVED_RUN_ID = "{{$.pipeline_job_uuid}}"


def step_env(compiled: Path, namespace: str, run_id: str) -> dict[str, str]:
    """The downward-API env of the compiled pipeline's steps, resolved as in a pod of the run
    (the same for every step: the test asserts so)."""
    docs = [d for d in yaml.safe_load_all(compiled.read_text()) if d]
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    meta = {"name": "step-pod", "namespace": namespace, "labels": {RUN_ID_LABEL: run_id},
            "annotations": {}}  # fmt: skip
    envs = []
    for executor in executors.values():
        fields = executor.get("fieldPathAsEnv") or []
        envs.append({f["name"]: _env_value(
            {"name": f["name"], "valueFrom": {"fieldRef": {"fieldPath": f["fieldPath"]}}}, meta
        ) for f in fields})  # fmt: skip
    assert envs and all(env == envs[0] for env in envs), envs
    return envs[0]


@contextlib.contextmanager
def unresolved_run_id() -> Iterator[None]:
    """kfp.local passing `{{$.pipeline_job_uuid}}` through as the text it is."""
    from kfp.local import placeholder_utils

    resolve = placeholder_utils.resolve_individual_placeholder
    # kfp.local would read the literal as one of its own placeholders: resolve it to a stand-in
    # first, then put the literal back into the resolved text.
    stand_in = "unresolved-pipeline-job-uuid"

    def keep_run_id(*args, **kwargs):
        kwargs["pipeline_job_id"] = stand_in
        return resolve(*args, **kwargs).replace(stand_in, UNRESOLVED_RUN_ID)

    placeholder_utils.resolve_individual_placeholder = keep_run_id
    try:
        yield
    finally:
        placeholder_utils.resolve_individual_placeholder = resolve
