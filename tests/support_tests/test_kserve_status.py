"""The test cluster's KServe rules (tests/support/cluster/kserve_status.py,
kserve_credentials.py), each against what KServe v0.20.0's source sets
(pkg/apis/serving/v1beta1/inference_service_status.go, the raw ingress reconciler, knative's
condition set, pkg/credentials): the conditions while a predictor starts, once it is available
and when it fails; the model's states; the URLs; the name limits; the storage initializer's S3
credentials."""

from __future__ import annotations

import pytest
from support.cluster.kserve_credentials import storage_env
from support.cluster.kserve_status import (
    Conditions,
    domain_name,
    propagate_model_status,
    propagate_raw_status,
    reconcile_ingress,
    update_model_transition_status,
)

NAME, NS = "gpt-run", "kubeflow"
URL = f"http://{NAME}-predictor-{NS}.example.com"


def deployment(*conditions: tuple[str, str, str], generation: int = 1) -> dict:
    return {"status": {"observedGeneration": generation, "conditions": [
        {"type": t, "status": s, "reason": r, "message": f"{r}."} for t, s, r in conditions]}}


def summary(status: dict) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c.get("reason", "")) for c in status["conditions"]]


def started() -> dict:
    status: dict = {}
    Conditions(status).initialize()
    return status


def test_conditions_start_unknown_and_are_kept_sorted_by_type():
    assert summary(started()) == [("IngressReady", "Unknown", ""),
                                  ("PredictorReady", "Unknown", ""), ("Ready", "Unknown", "")]


def test_ready_copies_the_last_dependent_marked_false_and_turns_true_only_with_all():
    status = started()
    conditions = Conditions(status)
    conditions.set("PredictorReady", "False", "MinimumReplicasUnavailable", "no pod")
    assert conditions.get("Ready")["reason"] == "MinimumReplicasUnavailable"
    conditions.set("IngressReady", "False", "Predictor ingress not created")
    assert conditions.get("Ready")["reason"] == "Predictor ingress not created"
    conditions.set("PredictorReady", "True", "NewReplicaSetAvailable")
    assert conditions.get("Ready")["status"] == "False"  # the ingress is still False
    conditions.set("IngressReady", "True")
    assert conditions.get("Ready")["status"] == "True"
    conditions.set("Stopped", "False")
    assert conditions.get("Stopped")["severity"] == "Info"  # not one of the living set


def test_a_condition_keeps_its_transition_time_while_nothing_else_changes(monkeypatch):
    status = started()
    conditions = Conditions(status)
    conditions.set("PredictorReady", "False", "MinimumReplicasUnavailable")
    first = conditions.get("PredictorReady")["lastTransitionTime"]
    monkeypatch.setattr("support.cluster.kserve_status.now", lambda: "2099-01-01T00:00:00Z")
    conditions.set("PredictorReady", "False", "MinimumReplicasUnavailable")
    assert conditions.get("PredictorReady")["lastTransitionTime"] == first
    conditions.set("PredictorReady", "False", "ProgressDeadlineExceeded")
    assert conditions.get("PredictorReady")["lastTransitionTime"] == "2099-01-01T00:00:00Z"


@pytest.mark.parametrize("conditions,want", [
    ((), ("False", "")),  # a Deployment without status yet
    ((("Progressing", "True", "NewReplicaSetCreated"),
      ("Available", "False", "MinimumReplicasUnavailable")),
     ("False", "MinimumReplicasUnavailable")),
    ((("Available", "True", "MinimumReplicasAvailable"),
      ("Progressing", "True", "NewReplicaSetAvailable")), ("True", "NewReplicaSetAvailable")),
    # a rollout: the old pod still serves
    ((("Available", "True", "MinimumReplicasAvailable"),
      ("Progressing", "True", "ReplicaSetUpdated")), ("True", "MinimumReplicasAvailable")),
    # past the progress deadline, the unavailable Deployment's reason is the one shown
    ((("Available", "False", "MinimumReplicasUnavailable"),
      ("Progressing", "False", "ProgressDeadlineExceeded")),
     ("False", "MinimumReplicasUnavailable")),
    ((("Available", "False", "MinimumReplicasUnavailable"),
      ("ReplicaFailure", "True", "FailedCreate")), ("False", "FailedCreate")),
])  # fmt: skip
def test_predictor_ready_follows_the_deployments_conditions(conditions, want):
    status = started()
    propagate_raw_status(status, deployment(*conditions), URL)
    predictor = Conditions(status).get("PredictorReady")
    assert (predictor["status"], predictor.get("reason", "")) == want
    assert ("url" in status["components"]["predictor"]) == (want[0] == "True")
    assert status["observedGeneration"] == 1


def pod(init: dict | None = None, main: dict | None = None, ready: bool = False) -> dict:
    status = {"phase": "Running" if ready else "Pending",
              "conditions": [{"type": "Ready", "status": str(ready)}],
              "containerStatuses": [{"name": "kserve-container", **(main or {"state": {}})}]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "storage-initializer", **init}]
    return status


CRASHED = {"terminated": {"exitCode": 1, "reason": "Error"}}


@pytest.mark.parametrize("pods,state,transition,failure", [
    ([], "Pending", "InProgress", None),
    ([pod(init={"state": {"running": {}}})], "Loading", "InProgress", None),
    ([pod(init={"state": CRASHED})], "FailedToLoad", "BlockedByFailedLoad",
     {"reason": "ModelLoadFailed", "exitCode": 1}),
    ([pod(init={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": CRASHED})],
     "FailedToLoad", "BlockedByFailedLoad", {"reason": "ModelLoadFailed", "exitCode": 1}),
    ([pod(main={"state": {"running": {}}})], "Pending", "InProgress", None),
    ([pod(main={"state": {"waiting": {"reason": "ImagePullBackOff"}}})], "Pending",
     "InProgress", None),
    ([pod(main={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": CRASHED})],
     "FailedToLoad", "BlockedByFailedLoad", {"reason": "ModelLoadFailed", "exitCode": 1}),
])  # fmt: skip
def test_the_models_state_is_read_off_the_first_pods_containers(pods, state, transition, failure):
    status = started()
    assert propagate_model_status(status, pods)
    model = status["modelStatus"]
    assert (model["states"]["targetModelState"], model["transitionStatus"]) == (state, transition)
    assert model.get("lastFailureInfo") == failure


def test_a_storage_initializer_running_again_after_a_failure_asks_for_a_requeue():
    status = started()
    again = pod(init={"state": {"running": {}}, "lastState": CRASHED})
    assert not propagate_model_status(status, [again])


def test_the_model_is_loaded_once_the_inferenceservice_is_ready():
    status = started()
    for kind in ("PredictorReady", "IngressReady"):
        Conditions(status).set(kind, "True")
    propagate_model_status(status, [pod(main={"state": {"running": {}}}, ready=True)])
    assert status["modelStatus"] == {
        "transitionStatus": "UpToDate", "copies": {"failedCopies": 0, "totalCopies": 1},
        "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"}}  # fmt: skip


def test_an_invalid_spec_fails_the_models_target_state():
    status = started()
    update_model_transition_status(status, "InvalidSpec", {"reason": "NoSupportingRuntime",
                                                           "message": "No runtime found"})
    assert status["modelStatus"] == {
        "transitionStatus": "InvalidSpec", "states": {"activeModelState": "",
                                                      "targetModelState": "FailedToLoad"},
        "lastFailureInfo": {"reason": "NoSupportingRuntime", "message": "No runtime found"}}


def test_the_urls_come_once_the_predictor_is_ready():
    status = started()
    reconcile_ingress(status, NAME, NS)
    assert "url" not in status and "address" not in status
    assert Conditions(status).get("IngressReady")["reason"] == "Predictor ingress not created"
    Conditions(status).set("PredictorReady", "True", "NewReplicaSetAvailable")
    reconcile_ingress(status, NAME, NS)
    assert status["url"] == f"http://{NAME}-{NS}.example.com"
    assert status["address"] == {"url": f"http://{NAME}-predictor.{NS}.svc.cluster.local"}
    assert Conditions(status).is_true("Ready")


def test_a_host_label_over_63_characters_is_refused():
    assert domain_name("a" * (63 - len(NS) - 1), NS)
    with pytest.raises(ValueError, match='must be no more than 63 characters'):
        domain_name("a" * (64 - len(NS) - 1), NS)


def s3_secret(annotations: dict, **data: str) -> dict:
    return {"metadata": {"name": "s3", "annotations": annotations},
            "stringData": {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key", **data}}


@pytest.mark.parametrize("annotations,want", [
    ({"serving.kserve.io/s3-endpoint": "minio:9000", "serving.kserve.io/s3-usehttps": "0"},
     {"S3_USE_HTTPS": "0", "S3_ENDPOINT": "minio:9000", "AWS_ENDPOINT_URL": "http://minio:9000"}),
    ({"serving.kserve.io/s3-endpoint": "s3.amazonaws.com"},  # https unless told
     {"S3_ENDPOINT": "s3.amazonaws.com", "AWS_ENDPOINT_URL": "https://s3.amazonaws.com"}),
    ({"serving.kserve.io/s3-endpoint": "http://minio:9000", "serving.kserve.io/s3-usehttps": "1"},
     {"S3_USE_HTTPS": "0", "S3_ENDPOINT": "minio:9000", "AWS_ENDPOINT_URL": "http://minio:9000"}),
    ({"serving.kserve.io/s3-region": "eu-west-1"}, {"AWS_DEFAULT_REGION": "eu-west-1"}),
])  # fmt: skip
def test_an_s3_secret_gives_the_keys_and_its_annotations_as_kserves_variables(annotations, want):
    isvc = {"metadata": {"name": "gpt"}, "spec": {"predictor": {"serviceAccountName": "sa"}}}
    env = storage_env(isvc, {"sa": {"secrets": [{"name": "s3"}]}}, {"s3": s3_secret(annotations)})
    assert env == {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key", **want}


def test_the_storage_secret_annotation_wins_and_no_account_means_no_credentials():
    secrets = {"s3": s3_secret({}), "other": s3_secret({}, AWS_ACCESS_KEY_ID="other")}
    isvc = {"metadata": {"name": "gpt", "annotations": {
        "serving.kserve.io/storageSecretName": "other"}}, "spec": {"predictor": {}}}
    assert storage_env(isvc, {"default": {"secrets": [{"name": "s3"}]}},
                       secrets)["AWS_ACCESS_KEY_ID"] == "other"  # fmt: skip
    assert storage_env(isvc, {}, secrets) == {}
