"""A step's run id and namespace on every KFP 2.x backend (components/step/context.py)."""

from __future__ import annotations

import pytest

from components.step import context as step_context
from components.step.context import NAMESPACE_ENV, RUN_ID_ENV

RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"
UNRESOLVED = "{{$.pipeline_job_uuid}}"  # what a KFP backend before 2.5.0 passes


@pytest.fixture(autouse=True)
def outside_a_pod(monkeypatch, tmp_path):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    monkeypatch.delenv(NAMESPACE_ENV, raising=False)
    monkeypatch.setattr(step_context, "SERVICEACCOUNT_NAMESPACE", tmp_path / "absent")


def test_a_resolved_run_id_is_taken_as_it_is(monkeypatch):
    monkeypatch.setenv(RUN_ID_ENV, "from-the-label")
    assert step_context.run_id(RUN_ID) == RUN_ID


def test_an_unresolved_placeholder_takes_the_pods_run_label(monkeypatch):
    monkeypatch.setenv(RUN_ID_ENV, RUN_ID)
    assert step_context.run_id(UNRESOLVED) == RUN_ID
    assert step_context.run_id("") == RUN_ID


def test_an_unresolved_placeholder_without_the_label_is_one_line():
    with pytest.raises(ValueError, match=r"kfp_run_id '\{\{\$\.pipeline_job_uuid\}\}'.*`run`"):
        step_context.run_id(UNRESOLVED)


def test_the_namespace_is_the_one_given_else_the_pods_own(monkeypatch, tmp_path):
    assert step_context.namespace("team-a") == "team-a"
    sa = tmp_path / "namespace"
    sa.write_text("kubeflow-user-example-com\n")
    monkeypatch.setattr(step_context, "SERVICEACCOUNT_NAMESPACE", sa)
    assert step_context.namespace("") == "kubeflow-user-example-com"
    monkeypatch.setenv(NAMESPACE_ENV, "kubeflow")  # the downward API, as the pipeline sets it
    assert step_context.namespace("") == "kubeflow"


def test_no_namespace_outside_a_pod_is_one_line():
    with pytest.raises(ValueError, match="namespace: empty, and this step runs outside a pod"):
        step_context.namespace("")
