"""The test API server behind RBAC (tests/support/cluster/frontdoor.py) and without KServe: what
the deploy step meets in a namespace that does not allow it InferenceServices, or on a cluster
without KServe, answered as the Kubernetes API server answers it."""

from __future__ import annotations

import json

import pytest
from support.cluster.frontdoor import forbidden, verb
from support.cluster.kserve import GROUP, PLURAL, VERSION

from components.trainjob.launcher import GROUP as TRAINER_GROUP
from components.trainjob.launcher import PLURAL as TRAINJOBS
from components.trainjob.launcher import VERSION as TRAINER_VERSION

NS = "kubeflow"
USER = "system:serviceaccount:kubeflow:pipeline-runner"


@pytest.mark.parametrize("method,name,query,want", [
    ("GET", "x", "", "get"), ("GET", None, "", "list"), ("GET", None, "watch=true", "watch"),
    ("POST", None, "", "create"), ("PUT", "x", "", "update"), ("PATCH", "x", "", "patch"),
    ("DELETE", "x", "", "delete"), ("DELETE", None, "", "deletecollection"),
])  # fmt: skip
def test_a_requests_verb_is_the_api_servers(method, name, query, want):
    assert verb(method, name, query) == want


def test_the_denial_is_the_api_servers_status():
    assert forbidden(USER, "patch", GROUP, PLURAL, NS, "gpt-x", None) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'inferenceservices.serving.kserve.io "gpt-x" is forbidden: User '
                   '"system:serviceaccount:kubeflow:pipeline-runner" cannot patch resource '
                   '"inferenceservices" in API group "serving.kserve.io" in the namespace '
                   '"kubeflow"',
        "reason": "Forbidden",
        "details": {"group": "serving.kserve.io", "kind": "inferenceservices", "name": "gpt-x"},
        "code": 403}  # fmt: skip
    listed = forbidden(USER, "list", GROUP, PLURAL, NS, None, None)
    assert listed["message"].startswith("inferenceservices.serving.kserve.io is forbidden: ")
    assert "name" not in listed["details"]


def client_api():
    """A CustomObjectsApi as the code under test makes it: from $KUBECONFIG."""
    from kubernetes import client

    from components.trainjob.launcher import load_kube_config

    load_kube_config()
    return client.CustomObjectsApi()


def isvc(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"},
                                             "storageUri": "pvc://gpt-pvc/run/model"}}}}


def test_a_forbidden_namespace_answers_403_and_the_rest_passes_through(forbidding_apiserver,
                                                                        trainer_cluster):
    from kubernetes.client.exceptions import ApiException
    from kubernetes.watch import Watch

    ns = trainer_cluster.namespace
    api = client_api()
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc("allowed"))
    forbidding_apiserver.forbid(ns, GROUP, PLURAL)
    with pytest.raises(ApiException) as denied:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc("gpt-x"))
    assert denied.value.status == 403
    status = json.loads(denied.value.body)
    assert status["message"] == (
        f'inferenceservices.serving.kserve.io is forbidden: User "system:serviceaccount:{ns}:'
        f'pipeline-runner" cannot create resource "inferenceservices" in API group '
        f'"serving.kserve.io" in the namespace "{ns}"')
    with pytest.raises(ApiException) as read:
        api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "allowed")
    assert json.loads(read.value.body)["details"]["name"] == "allowed"
    # Other resources, and the same one elsewhere, pass through, a watch's stream too.
    assert api.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, ns,
                                             TRAINJOBS)["items"] == []  # fmt: skip
    assert api.list_namespaced_custom_object(GROUP, VERSION, f"{ns}-other", PLURAL)["items"] == []
    events = Watch().stream(api.list_namespaced_custom_object, TRAINER_GROUP, TRAINER_VERSION,
                            ns, TRAINJOBS, timeout_seconds=1)  # fmt: skip
    assert list(events) == []


def test_a_cluster_without_kserve_has_no_inferenceservices(apiserver_without_kserve):
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as missing:
        client_api().list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert missing.value.status == 404
