"""The test cluster's `TrainJobStatus` feature gate (tests/support/cluster/): what Trainer v2.3.0's
plugin gives a TrainJob's pods, and its status server's answers, each applied status judged by
the test API server's TrainJob CRD (its schema and CEL rule) as a cluster's would be."""

from __future__ import annotations

import http.client
import json
import ssl

import pytest
from support.apiserver import namespace
from support.cluster import runtimes
from support.cluster.certs import TokenIssuer
from support.cluster.render import STATUS_MOUNT, TRAINJOB_STATUS, render, token_audience
from support.cluster.statusserver import MAX_BODY, StatusServer, api_apply

from components.trainjob.launcher import GROUP, PLURAL, VERSION


def trainjob(runtime: str, name: str = "train-gpt-r-abc123", ns: str = "team-a") -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": runtime},
                     "trainer": {"command": ["true"]}}}  # fmt: skip


@pytest.mark.parametrize("runtime", ["gpt-train-gpt", "gpt-load-corpus", "torch-distributed"])
def test_the_gate_gives_every_trainjobs_trainer_the_status_server(shared, runtime):
    (rt,) = [r for r in runtimes(shared) if r["metadata"]["name"] == runtime]
    off = render(trainjob(runtime), rt)
    assert not [e for e in off.container["env"] if e["name"].startswith("KUBEFLOW_TRAINER")]
    on = render(trainjob(runtime), rt, frozenset({TRAINJOB_STATUS}))
    env = {e["name"]: e["value"] for e in on.container["env"] if "value" in e}
    assert env["KUBEFLOW_TRAINER_SERVER_URL"] == (
        "https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443"
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/train-gpt-r-abc123/status")
    assert env["KUBEFLOW_TRAINER_SERVER_CA_CERT"] == f"{STATUS_MOUNT}/ca.crt"
    assert env["KUBEFLOW_TRAINER_SERVER_TOKEN"] == f"{STATUS_MOUNT}/token"
    assert {"name": "kubeflow-trainer-token", "mountPath": STATUS_MOUNT,
            "readOnly": True} in on.container["volumeMounts"]  # fmt: skip
    (volume,) = [v for v in on.pod_spec["volumes"] if v["name"] == "kubeflow-trainer-token"]
    token, config_map = volume["projected"]["sources"]
    assert token["serviceAccountToken"] == {
        "audience": "trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/"
                    "train-gpt-r-abc123/status",
        "expirationSeconds": 3600, "path": "token"}  # fmt: skip
    assert config_map["configMap"]["name"] == "train-gpt-r-abc123-tls-config"
    # The runtime's own env and mounts are kept (the PVC at /gpt).
    assert len(on.container["volumeMounts"]) == len(off.container.get("volumeMounts") or []) + 1


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture
def status_server(custom_api, issuer):
    """The status server applying through the test API server, and a TrainJob there."""
    server = StatusServer(issuer, api_apply(custom_api))
    ns = namespace()
    custom_api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                               trainjob("gpt-train-gpt", ns=ns))  # fmt: skip
    server.ns, server.job = ns, "train-gpt-r-abc123"
    server.token = issuer.issue(token_audience(ns, server.job), 3600, ns,
                                {"name": "p", "uid": "u"})  # fmt: skip
    server.other_ns_token = issuer.issue(token_audience(ns, server.job), 3600, "elsewhere",
                                         {"name": "p", "uid": "u"})  # fmt: skip
    yield server
    server.stop()


def post(server: StatusServer, body: bytes | dict, token: str | None = None, name: str = "",
         method: str = "POST", headers: dict | None = None) -> tuple[int, dict]:  # fmt: skip
    context = ssl.create_default_context(cadata=server.cert.ca_pem.decode())
    host, port = server.address.split(":")
    conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    path = server.url(server.ns, name or server.job).split(server.address, 1)[1]
    conn.request(method, path, data, {"Authorization": f"Bearer {token or server.token}",
                                      **(headers or {})})  # fmt: skip
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, answer


def trainer_status(custom_api, server) -> dict | None:
    obj = custom_api.get_namespaced_custom_object(GROUP, VERSION, server.ns, PLURAL, server.job)
    return (obj.get("status") or {}).get("trainerStatus")


GOOD = {"trainerStatus": {"progressPercentage": 42, "estimatedRemainingSeconds": 90,
                          "metrics": [{"name": "loss", "value": "3.25"}],
                          "lastUpdatedTime": "2026-11-28T12:00:00.5+01:00"}}  # fmt: skip


@pytest.mark.apiserver
def test_an_update_is_applied_to_the_trainjobs_status(custom_api, status_server):
    assert trainer_status(custom_api, status_server) is None
    code, answer = post(status_server, GOOD)
    assert code == 200
    want = {"progressPercentage": 42, "estimatedRemainingSeconds": 90,
            "metrics": [{"name": "loss", "value": "3.25"}],
            "lastUpdatedTime": "2026-11-28T11:00:00Z"}  # fmt: skip
    assert answer == {"trainerStatus": want}
    assert trainer_status(custom_api, status_server) == want
    # A later apply owns the whole trainerStatus: what it leaves out is gone.
    later = {"trainerStatus": {"progressPercentage": 100,
                               "lastUpdatedTime": "2026-11-28T12:05:00Z"}}  # fmt: skip
    assert post(status_server, later)[0] == 200
    assert trainer_status(custom_api, status_server) == later["trainerStatus"]
    # No trainerStatus: nothing to apply, the request echoed.
    assert post(status_server, {"other": 1}) == (200, {})


@pytest.mark.apiserver
@pytest.mark.parametrize("status,message", [
    ({"progressPercentage": 101}, "progressPercentage: Invalid value: 101"),
    ({"estimatedRemainingSeconds": -1}, "estimatedRemainingSeconds: Invalid value: -1"),
    ({"metrics": [{"name": "x" * 65, "value": "1"}]}, "Too long"),
    ({"metrics": [{"name": "loss", "value": ""}]}, "should be at least 1 chars long"),
    ({"metrics": [{"name": str(i), "value": "1"} for i in range(257)]}, "must have at most 256"),
])  # fmt: skip
def test_the_crd_refuses_what_it_does_not_admit(custom_api, status_server, status, message):
    body = {"trainerStatus": {**status, "lastUpdatedTime": "2026-11-28T12:00:00Z"}}
    code, answer = post(status_server, body)
    assert (code, answer["reason"]) == (422, "Invalid") and message in answer["message"], answer
    assert trainer_status(custom_api, status_server) is None


@pytest.mark.apiserver
def test_an_update_without_last_updated_time_is_refused(custom_api, status_server):
    # server.go's toApplyConfig always sets it: the zero time, which metav1.Time marshals as
    # null, and the API server refuses (before the CEL rule that wants it is even checked).
    code, answer = post(status_server, {"trainerStatus": {"progressPercentage": 5}})
    assert code == 422
    assert ("status.trainerStatus.lastUpdatedTime: Invalid value: \"null\": "
            "trainerStatus.lastUpdatedTime in body must be of type string") in answer["message"]
    assert trainer_status(custom_api, status_server) is None


@pytest.mark.apiserver
def test_the_handler_refuses_as_upstreams_does(status_server):
    s = status_server
    assert post(s, GOOD, token=s.other_ns_token)[0] == 403  # a pod of another namespace
    assert post(s, GOOD, token="not.a.jwt")[1]["message"] == "Forbidden"
    assert post(s, GOOD, headers={"Authorization": f"Basic {s.token}"})[0] == 403
    for bad in (b"{", b"[1]", b'{"trainerStatus": {"progressPercentage": 4.5}}',
                b'{"trainerStatus": {"progressPercentage": 2147483648}}',
                b'{"trainerStatus": {"lastUpdatedTime": "28 Nov 2026"}}',
                b'{"trainerStatus": {"metrics": [{"name": 1, "value": "1"}]}}'):
        assert post(s, bad) == (422, {"metadata": {}, "status": "Failure", "reason": "Invalid",
                                      "message": "Invalid payload", "code": 422}), bad  # fmt: skip
    assert post(s, b" " * (MAX_BODY + 1))[0] == 413
    assert post(s, GOOD, method="GET")[1]["message"] == "Not found"
    assert post(s, GOOD, name="gone")[0] == 403  # the token is for another TrainJob
    gone = s.issuer.issue(token_audience(s.ns, "gone"), 60, s.ns, {"name": "p", "uid": "u"})
    assert post(s, GOOD, token=gone, name="gone")[1]["message"] == "Train job not found"
