"""What a pipeline step knows of itself on a cluster: its KFP run id and its namespace.

Both come from the step's own pod, on every KFP 2.x backend:
- **The run id.** The pipeline passes `dsl.PIPELINE_JOB_ID_PLACEHOLDER`, but KFP backends before
  2.5.0 hand it to the task unresolved, as the literal `{{$.pipeline_job_uuid}}`
  (kubeflow/pipelines backend/src/v2/driver/driver.go; resolved from 2.5.0 on, #11599 for
  #10453; Kubeflow 1.9 ships 2.2). Every KFP step pod carries the label `pipeline/runid: <run
  id>` (backend/src/apiserver/template/v2_template.go, `SetPodMetadataLabels`, 2.2.0 on), and
  the compiled pipeline hands that label to the step through the downward API as `RUN_ID_ENV`
  (`kfp.kubernetes.use_field_path_as_env`, applied by the driver from KFP 2.2.0 on:
  driver.go `GetFieldPathAsEnv`). The same label for every step and retry of one run.
- **The namespace.** `kubeflow` on standalone KFP, the user's profile namespace on the
  multi-user platform: the downward API's `metadata.namespace` (`NAMESPACE_ENV`, set by the
  compiled pipeline), else the service account's namespace file every pod has.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_ID_ENV = "GPT_KFP_RUN_ID"
RUN_ID_LABEL = "pipeline/runid"
NAMESPACE_ENV = "GPT_STEP_NAMESPACE"
SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _unresolved(value: str) -> bool:
    return value.startswith("{{") and value.endswith("}}")


def run_id(passed: str) -> str:
    """The KFP run id: `passed` when the backend resolved it, else the step pod's label."""
    if passed and not _unresolved(passed):
        return passed
    labelled = os.environ.get(RUN_ID_ENV, "")
    if labelled:
        return labelled
    raise ValueError(
        f"kfp_run_id {passed!r}: this KFP backend did not resolve the run id and the step has no "
        f"{RUN_ID_ENV} (its pod's {RUN_ID_LABEL} label); set the pipeline parameter `run`"
    )


def namespace(passed: str) -> str:
    """`passed`, or when it is empty the namespace this step runs in."""
    if passed:
        return passed
    own = os.environ.get(NAMESPACE_ENV, "")
    if own:
        return own
    try:
        return SERVICEACCOUNT_NAMESPACE.read_text().strip()
    except FileNotFoundError:
        raise ValueError(
            f"namespace: empty, and this step runs outside a pod (no {NAMESPACE_ENV}, no "
            f"{SERVICEACCOUNT_NAMESPACE}): name the namespace of the TrainJobs"
        ) from None
