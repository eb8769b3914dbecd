"""The test cluster's KServe controller (tests/support/cluster/kserve.py) on the test API server,
where it fails before any predictor pod would start (no server needed): KServe v0.20.0's
finalizer, a model format no runtime supports, a name too long for the predictor's host."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from support.apiserver import apply_cluster_object, namespace
from support.cluster import kserve_runtime
from support.cluster.kserve import FINALIZER, GROUP, PLURAL, RUNTIME_VERSION, VERSION, KServe

from components.trainjob.warning_events import LogDirEvents


@pytest.fixture
def kserve(kserve_api, shared, tmp_path):
    """KServe's controller on a fresh namespace, with KServe's Hugging Face runtime."""
    apply_cluster_object(kserve_api, kserve_runtime(shared), "clusterservingruntimes",
                         group=GROUP, version=RUNTIME_VERSION)  # fmt: skip
    controller = KServe(kserve_api, namespace(), lambda *_: None, tmp_path,
                        Path(sys.executable))  # never started here: no pod gets that far
    yield controller
    controller.shutdown()
    assert not controller.errors


def isvc(name: str, model_format: str = "huggingface") -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"predictor": {"model": {"modelFormat": {"name": model_format},
                                             "storageUri": "s3://models/run/model"}}}}


def status_when(kserve: KServe, name: str, done) -> dict:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        obj = kserve.api.get_namespaced_custom_object(GROUP, VERSION, kserve.namespace, PLURAL,
                                                      name)  # fmt: skip
        if done(obj):
            return obj
        time.sleep(0.1)
    raise AssertionError(f"{name}: {obj}")


def test_a_model_format_no_runtime_supports_is_an_invalid_spec_and_deletion_is_let_through(
        kserve: KServe):  # fmt: skip
    kserve.api.create_namespaced_custom_object(GROUP, VERSION, kserve.namespace, PLURAL,
                                               isvc("gpt", "sklearn"))  # fmt: skip
    obj = status_when(kserve, "gpt", lambda o: "modelStatus" in o.get("status", {}))
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    status = obj["status"]
    assert status["modelStatus"] == {
        "transitionStatus": "InvalidSpec",
        "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
        "lastFailureInfo": {"reason": "NoSupportingRuntime",
                            "message": "No runtime found to support specified framework/version"}}
    # The reconcile failed before any condition was set: they stay as initialized.
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("IngressReady", "Unknown"), ("PredictorReady", "Unknown"), ("Ready", "Unknown")]
    assert status["deploymentMode"] == "Standard"
    # The reconcile's error, as a Warning Event on the InferenceService.
    warnings = LogDirEvents(kserve.pods).warnings(kserve.namespace, "InferenceService", "gpt",
                                                  obj["metadata"]["uid"])  # fmt: skip
    assert {(w.reason, w.message) for w in warnings} == {
        ("InternalError", "no runtime found to support predictor with model type: "
                          "{sklearn <nil>}")}  # fmt: skip

    kserve.api.delete_namespaced_custom_object(GROUP, VERSION, kserve.namespace, PLURAL, "gpt")
    end = time.monotonic() + 30
    while kserve.api.list_namespaced_custom_object(GROUP, VERSION, kserve.namespace,
                                                   PLURAL)["items"]:  # fmt: skip
        assert time.monotonic() < end, "the finalizer was not removed"
        time.sleep(0.1)


def test_a_name_too_long_for_the_predictors_host_fails_the_reconcile(kserve: KServe):
    # <name>-predictor-<namespace> is one DNS label of the predictor's URL: 63 characters.
    name = "g" * (63 - len("-predictor-") - len(kserve.namespace) + 1)
    kserve.api.create_namespaced_custom_object(GROUP, VERSION, kserve.namespace, PLURAL,
                                               isvc(name))  # fmt: skip
    status = status_when(kserve, name, lambda o: any(
        c["type"] == "PredictorReady" and c["status"] == "False"
        for c in o.get("status", {}).get("conditions", [])))["status"]
    predictor = next(c for c in status["conditions"] if c["type"] == "PredictorReady")
    host = f"{name}-predictor-{kserve.namespace}.example.com"
    assert predictor["reason"] == "ReconcileFailed"
    assert predictor["message"] == (
        f'fails to create NewRawKubeReconciler for predictor: failed creating host name: '
        f'invalid domain name "{host}": url: Invalid value: "{host.split(".")[0]}": '
        "must be no more than 63 characters")
    assert status["clusterServingRuntimeName"] == "kserve-huggingfaceserver"
    assert kserve.deployments == {}  # nothing was created


def test_a_predictor_whose_image_never_pulls_stays_not_ready_and_an_update_rolls_out_surge_first(
        kserve_cluster_without_images):  # fmt: skip
    cluster = kserve_cluster_without_images
    ns = cluster.namespace
    body = isvc("gpt")
    body["spec"]["predictor"]["model"]["storageUri"] = "pvc://gpt-pvc/run/model"
    cluster.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def pulling(o: dict) -> bool:
        deployment = cluster.controller.deployments.get("gpt")
        return bool(deployment and deployment.current and deployment.current.status()[
            "containerStatuses"][0]["state"].get("waiting", {}).get("reason")
            == "ImagePullBackOff" and o.get("status", {}).get("modelStatus"))

    status = status_when(cluster.controller, "gpt", pulling)["status"]
    reasons = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
    assert reasons["PredictorReady"] == ("False", "MinimumReplicasUnavailable")
    assert status["modelStatus"]["transitionStatus"] == "InProgress"
    assert status["modelStatus"]["states"]["targetModelState"] == "Pending"
    assert "url" not in status and "address" not in status
    (old,) = cluster.controller.deployments["gpt"].pods
    # The step's re-run updates the service: a new ReplicaSet's pod beside the old one, which
    # stays until the new one is available (maxUnavailable 0).
    cluster.api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gpt", {
        "spec": {"predictor": {"model": {"args": ["--max_length=32"]}}}})
    end = time.monotonic() + 30
    while len(cluster.controller.deployments["gpt"].pods) < 2:
        assert time.monotonic() < end
        time.sleep(0.1)
    old_, new = cluster.controller.deployments["gpt"].pods
    assert old_ is old and new.pod_name.rsplit("-", 2)[1] != old.pod_name.rsplit("-", 2)[1]
    assert new.template.args[-1] == "--max_length=32"
    assert new.template.args[0] == "--model_name=gpt"  # the runtime's, its placeholder replaced


def test_a_claim_that_is_not_there_leaves_the_predictor_unscheduled(kserve_cluster_without_images):
    cluster = kserve_cluster_without_images
    body = isvc("gpt")
    body["spec"]["predictor"]["model"]["storageUri"] = "pvc://no-such-claim/run/model"
    cluster.api.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
    status = status_when(cluster.controller, "gpt", lambda o: any(
        c["type"] == "PredictorReady" and c["status"] == "False"
        for c in o.get("status", {}).get("conditions", [])))["status"]
    predictor = next(c for c in status["conditions"] if c["type"] == "PredictorReady")
    assert predictor["reason"] == "MinimumReplicasUnavailable"
    # No container ever ran: nothing tells the model's state (Go's zero value).
    assert status["modelStatus"] == {"transitionStatus": "", "copies": {"failedCopies": 0}}
    (pod,) = cluster.controller.predictor("gpt").pods
    assert pod.status()["conditions"][0]["message"] == (
        '0/1 nodes are available: persistentvolumeclaim "no-such-claim" not found.')
