"""The test cluster's KServe (tests/support/cluster/kserve.py) with KServe's own server: an
InferenceService of a run's model, made as manifests/serve/inferenceservice.yaml makes it and
created through the API server, comes to Ready with the status KServe v0.20.0 writes, and its
cluster address answers `/openai/v1/completions` with our CLI's greedy text; one whose storageUri
holds no model fails as KServe reports it. `make test-serving` runs these (marker `serving`)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import yaml
from support.cluster import KServeCluster
from support.cluster.kserve import GROUP, PLURAL, VERSION
from support.models import cli_replies
from support.paths import PROJECT
from support.runs import train, write_data

from gpt.rundir.layout import RunDir

MANIFEST = PROJECT / "manifests" / "serve" / "inferenceservice.yaml"
S3_MANIFEST = PROJECT / "manifests" / "serve" / "inferenceservice-s3.yaml"
RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id
NAME = f"gpt-{RUN_ID}"
PROMPT, TOKENS = "ANTIPHOLUS: ", 12
READY_S = 180  # the server's start on a busy 2-core machine


def inferenceservice(run: str) -> dict:
    """The manifest as `envsubst '$RUN'` renders it."""
    return yaml.safe_load(MANIFEST.read_text().replace("${RUN}", run))


def trained(pvc, *flags: str) -> RunDir:
    """A tiny run trained on the PVC as train-gpt leaves it there: `<pvc>/<run>/model/`."""
    write_data(pvc, RUN_ID)
    assert train(pvc, RUN_ID, "--max_iters", "60", "--block_size", "32", *flags) == 0
    return RunDir.of(pvc, RUN_ID)


def wait_for(cluster: KServeCluster, name: str, done, timeout: float) -> dict:
    """The InferenceService once `done(status)` holds."""
    end = time.monotonic() + timeout
    while True:
        status = cluster.inferenceservice(name).get("status") or {}
        if done(status):
            return status
        assert time.monotonic() < end, (
            f"not there in {timeout} s: {json.dumps(status, indent=1)}\n"
            f"{cluster.controller.predictor(name).current.log()[-3000:]}")  # fmt: skip
        time.sleep(0.2)


def condition(status: dict, kind: str) -> dict:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def is_ready(status: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def completion(url: str, body: dict) -> dict:
    """POST through the cluster's address (urllib takes http_proxy, as a client in the cluster
    reaches the Service directly; an opener of its own: urlopen's is made once a process, with
    the proxy of the test that first called it)."""
    request = urllib.request.Request(f"{url}/openai/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler())
    with opener.open(request, timeout=60) as response:
        return json.loads(response.read())


def test_a_runs_inferenceservice_becomes_ready_as_kserve_says_and_answers_our_clis_text(
        kserve_cluster: KServeCluster):  # fmt: skip
    run = trained(kserve_cluster.pvc)
    ns = kserve_cluster.namespace
    kserve_cluster.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                       inferenceservice(RUN_ID))  # fmt: skip

    # While the server loads: not Ready, the predictor's Deployment not yet available, no URL.
    starting = wait_for(kserve_cluster, NAME, lambda s: "modelStatus" in s, 30)
    assert not is_ready(starting) and "url" not in starting
    assert condition(starting, "IngressReady")["reason"] == "Predictor ingress not created"

    status = wait_for(kserve_cluster, NAME, is_ready, READY_S)
    # The conditions KServe's living set holds, sorted by type (knative's SetCondition), each
    # True: PredictorReady from the Deployment's Progressing NewReplicaSetAvailable.
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("IngressReady", "True"), ("PredictorReady", "True"), ("Ready", "True"),
        ("Stopped", "False")]  # fmt: skip
    predictor = condition(status, "PredictorReady")
    assert predictor["reason"] == "NewReplicaSetAvailable"
    assert predictor["message"].startswith(f'ReplicaSet "{NAME}-predictor-')
    assert condition(status, "Stopped")["severity"] == "Info"
    # The URLs of a raw deployment: the Ingress's host from the default domain template, the
    # predictor Service's cluster address, the component's own host.
    assert status["url"] == f"http://{NAME}-{ns}.example.com"
    assert status["address"] == {"url": f"http://{NAME}-predictor.{ns}.svc.cluster.local"}
    assert status["components"] == {
        "predictor": {"url": f"http://{NAME}-predictor-{ns}.example.com"}}
    assert status["deploymentMode"] == "Standard"
    assert status["clusterServingRuntimeName"] == "kserve-huggingfaceserver"
    # The model: loaded once Ready (the reconcile that follows the Ready one), one copy.
    loaded = wait_for(kserve_cluster, NAME,
                      lambda s: s["modelStatus"]["transitionStatus"] == "UpToDate", 30)
    assert loaded["modelStatus"] == {
        "transitionStatus": "UpToDate", "copies": {"failedCopies": 0, "totalCopies": 1},
        "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"}}  # fmt: skip

    answer = completion(status["address"]["url"], {"model": NAME, "prompt": PROMPT,
                                                    "max_tokens": TOKENS, "temperature": 0})
    assert answer["model"] == NAME  # --model_name: the InferenceService's name
    assert answer["choices"][0]["text"] == cli_replies(run, [PROMPT], TOKENS)[0]
    # The Ingress's host reaches the same predictor.
    assert completion(status["url"], {"model": NAME, "prompt": PROMPT, "max_tokens": TOKENS,
                                      "temperature": 0})["choices"][0]["text"] == (
        answer["choices"][0]["text"])


def test_an_s3_export_is_fetched_by_kserves_storage_initializer_with_the_secrets_keys(
        kserve_cluster: KServeCluster, monkeypatch):  # fmt: skip
    pytest.importorskip("moto", reason="the S3 test server is moto's (the dev extra)")
    from bench.s3server import AWS_VARIABLES, BUCKET, S3Server

    ns, export_uri = kserve_cluster.namespace, f"s3://{BUCKET}/runs/{RUN_ID}"
    with S3Server() as s3:
        for name in AWS_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in s3.env().items():  # the TrainJob's storage Secret
            monkeypatch.setenv(name, value)
        run = trained(kserve_cluster.pvc, "--export_uri", export_uri)
        for name in s3.env():
            monkeypatch.delenv(name)  # the predictor gets KServe's credentials, not these
        text = S3_MANIFEST.read_text()
        for key, value in (("RUN", RUN_ID), ("EXPORT_URI", export_uri), ("SECRET", "gpt-s3")):
            text = text.replace("${" + key + "}", value)
        account, isvc = yaml.safe_load_all(text)
        # The storage Secret as docs/cluster.md says KServe reads it: the keys, the endpoint.
        kserve_cluster.controller.service_accounts[account["metadata"]["name"]] = account
        kserve_cluster.controller.secrets["gpt-s3"] = {
            "metadata": {"name": "gpt-s3", "annotations": {
                "serving.kserve.io/s3-endpoint": s3.url.removeprefix("http://"),
                "serving.kserve.io/s3-usehttps": "0",
                "serving.kserve.io/s3-region": "us-east-1"}},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.key_id,
                           "AWS_SECRET_ACCESS_KEY": s3.secret}}  # fmt: skip
        kserve_cluster.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc)
        status = wait_for(kserve_cluster, NAME, is_ready, READY_S)

    pod = kserve_cluster.controller.predictor(NAME).current
    (init,) = pod.status()["initContainerStatuses"]
    assert init["name"] == "storage-initializer" and init["state"]["terminated"]["exitCode"] == 0
    assert "Storage initialization failed" not in pod.log("storage-initializer")
    answer = completion(status["address"]["url"], {"model": NAME, "prompt": PROMPT,
                                                    "max_tokens": TOKENS, "temperature": 0})
    assert answer["choices"][0]["text"] == cli_replies(run, [PROMPT], TOKENS)[0]


def test_a_storage_uri_without_a_model_fails_to_load_as_kserve_reports_it(
        kserve_cluster: KServeCluster):  # fmt: skip
    ns = kserve_cluster.namespace
    isvc = inferenceservice(RUN_ID)  # the run's model/ was never written: an empty folder
    kserve_cluster.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc)

    # The server exits 1 and the kubelet backs off from restarting it. Nothing KServe watches
    # changes with a container's crash: its next reconcile reads it off the pod, whatever
    # brings one (the Deployment's progress deadline, KSERVE_PROGRESS_DEADLINE_S here, if the
    # container is down then; here a change of the InferenceService).
    end = time.monotonic() + READY_S
    while not kserve_cluster.crash_looping(NAME):
        assert time.monotonic() < end, "the server did not fail"
        time.sleep(0.2)
    kserve_cluster.touch(NAME)
    status = wait_for(kserve_cluster, NAME,
                      lambda s: s.get("modelStatus", {}).get("transitionStatus")
                      == "BlockedByFailedLoad", 30)  # fmt: skip
    model = status["modelStatus"]
    assert model["states"]["targetModelState"] == "FailedToLoad"
    assert model["lastFailureInfo"] == {"reason": "ModelLoadFailed", "exitCode": 1}
    # Not Ready: the Deployment has no available pod, whatever its progress says; Ready says
    # what the ingress, reconciled last, marked False (knative's MarkFalse copies it there).
    reasons = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
    assert reasons == {"PredictorReady": ("False", "MinimumReplicasUnavailable"),
                       "IngressReady": ("False", "Predictor ingress not created"),
                       "Ready": ("False", "Predictor ingress not created"),
                       "Stopped": ("False", None)}  # fmt: skip
    assert "url" not in status and "address" not in status
    log = kserve_cluster.controller.predictor(NAME).current.log()
    assert "Failed to start model server" in log
    with pytest.raises(urllib.error.HTTPError) as refused:
        completion(f"http://{NAME}-predictor.{ns}.svc.cluster.local", {"model": NAME,
                                                                      "prompt": PROMPT})
    assert refused.value.code == 503  # no ready endpoint
