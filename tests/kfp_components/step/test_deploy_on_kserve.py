"""The deploy step against the test cluster's KServe (tests/support/cluster/kserve.py: KServe
v0.20.0's controller in raw deployment, its predictor KServe's own Hugging Face server): the
component, as kfp.local runs it, applies a trained run's InferenceService through the API
server, waits for Ready, and the completion it asks for at the cluster address is our CLI's
greedy reply; so does the compiled pipeline with serve=kserve. Each failure a person must act on
is one line, the service left in place: no KServe, RBAC forbidding it, a model that does not
load, an image that does not pull. The tests that need KServe's server are `make
test-serving`'s (marker `serving`, from the kserve_cluster fixture); the others are `make
test`'s."""

from __future__ import annotations

import threading
import time

import pytest
from support.cluster import KServeCluster
from support.models import cli_replies
from support.runs import train, write_data

from components.serving.completion import PROBE_PROMPT, probe_tokens
from components.serving.inferenceservice import GROUP, PLURAL, VERSION, ServingError
from components.step.context import NAMESPACE_ENV
from components.step.deployment import Serving, deploy
from gpt.rundir.layout import RunDir

RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id
NAME = f"gpt-{RUN_ID}"  # fits the test cluster's namespaces (t-<8 hex>)
READY_S = 300.0  # the server's start on a busy 2-core machine
BLOCK = 32  # the run's context


def as_the_steps_pod(cluster: KServeCluster, monkeypatch) -> KServeCluster:
    """The cluster as the step's pod sees it: its namespace from the downward API, the API
    server from the kube config."""
    monkeypatch.setenv(NAMESPACE_ENV, cluster.namespace)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return cluster


@pytest.fixture
def cluster(kserve_cluster: KServeCluster, monkeypatch) -> KServeCluster:
    """kserve_cluster, as the step's pod sees it."""
    return as_the_steps_pod(kserve_cluster, monkeypatch)


def trained(pvc) -> RunDir:
    """A tiny run on the PVC as train-gpt leaves it there: `<pvc>/<run>/model/`."""
    write_data(pvc, RUN_ID)
    assert train(pvc, RUN_ID, "--max_iters", "60", "--block_size", str(BLOCK)) == 0
    return RunDir.of(pvc, RUN_ID)


# kfp.local warns that the step's image is not this Python; running it here is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_step_serves_the_run_and_kserves_server_answers_with_our_clis_reply(cluster,
                                                                               tmp_path):
    from kfp import local

    from components.deploy_model import deploy_model

    run = trained(cluster.pvc)
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
    task = deploy_model(run=RUN_ID, serve="kserve", serve_timeout=READY_S, block_size=BLOCK)

    address = f"http://{NAME}-predictor.{cluster.namespace}.svc.cluster.local"
    assert task.outputs["Output"] == f"{address}/openai/v1"
    reply = cli_replies(run, [PROBE_PROMPT], probe_tokens(BLOCK))[0]
    usage = open(task.outputs["usage"].path).read()
    assert f"It answered `{PROBE_PROMPT}` with:\n\n```text\n{reply}\n```" in usage
    assert f"curl {address}/openai/v1/completions" in usage
    isvc = cluster.inferenceservice(NAME)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"pvc://gpt-pvc/{RUN_ID}/model"
    assert isvc["status"]["clusterServingRuntimeName"] == "kserve-huggingfaceserver"

    # A re-run applies the same service again: unchanged, Ready, the same answer.
    again = deploy(Serving("kserve", serve_timeout=READY_S), RUN_ID, export_uri="",
                   namespace="", backend="trainjob", block_size=BLOCK,
                   say=lambda _: None)  # fmt: skip
    assert again.reply == reply
    after = cluster.inferenceservice(NAME)
    assert (after["metadata"]["uid"], after["metadata"]["generation"]) == (
        isvc["metadata"]["uid"], isvc["metadata"]["generation"])


def test_a_model_that_does_not_load_fails_the_step_as_kserve_reports_it(cluster):
    # The run's model/ was never written: the server exits 1 on the empty folder.
    (cluster.pvc / RUN_ID / "model").mkdir(parents=True)

    # KServe writes BlockedByFailedLoad at its next reconcile that finds the server down; a
    # crash alone brings none (the Deployment's progress deadline may find it restarting): a
    # change of the InferenceService does, once the server is down.
    def touch_when_down() -> None:
        end = time.monotonic() + READY_S
        while not cluster.crash_looping(NAME) and time.monotonic() < end:
            time.sleep(0.2)
        cluster.touch(NAME)

    toucher = threading.Thread(target=touch_when_down, daemon=True)
    toucher.start()
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=READY_S), RUN_ID, export_uri="", namespace="",
               backend="trainjob", say=lambda _: None)  # fmt: skip
    toucher.join(10)
    ns = cluster.namespace
    assert str(err.value) == (
        f"InferenceService {ns}/{NAME}: the predictor failed: BlockedByFailedLoad: "
        f"ModelLoadFailed (exit code 1); its logs: kubectl -n {ns} logs -l "
        f"serving.kserve.io/inferenceservice={NAME} -c storage-initializer (the model's "
        "download) or -c kserve-container (the server); it is left in place")
    assert cluster.api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)


def test_an_image_that_does_not_pull_is_not_ready_in_time_in_one_line(
        kserve_cluster_without_images, monkeypatch):  # fmt: skip
    cluster = as_the_steps_pod(kserve_cluster_without_images, monkeypatch)
    (cluster.pvc / RUN_ID / "model").mkdir(parents=True)  # never read: the pod never starts
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=3), RUN_ID, export_uri="", namespace="",
               backend="trainjob", say=lambda _: None)  # fmt: skip
    ns, pods = cluster.namespace, f"-l serving.kserve.io/inferenceservice={NAME}"
    assert str(err.value) == (
        f"InferenceService {ns}/{NAME}: not Ready within 3 s: PredictorReady False: "
        "MinimumReplicasUnavailable: Deployment does not have minimum availability.; model "
        f"Pending; kubectl -n {ns} describe pods {pods} says why (an image that does not pull, "
        f"no node with room, a server that keeps exiting: then kubectl -n {ns} logs {pods} -c "
        "kserve-container), or raise serve_timeout; it is left in place")
    assert cluster.api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)


def test_a_cluster_without_kserve_is_one_line(apiserver_without_kserve, monkeypatch):
    monkeypatch.setenv(NAMESPACE_ENV, "kubeflow")
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=READY_S), RUN_ID, export_uri="", namespace="",
               backend="trainjob", say=lambda _: None)  # fmt: skip
    assert str(err.value) == (
        f"InferenceService kubeflow/{NAME}: the API server has no serving.kserve.io/v1beta1 "
        "inferenceservices (HTTP 404): KServe is not installed; install KServe (its CRDs and "
        "controller) or run without serve")


def test_rbac_forbidding_inferenceservices_is_one_line(trainer_cluster, kserve_api,
                                                       forbidding_apiserver, monkeypatch):
    ns = trainer_cluster.namespace
    monkeypatch.setenv(NAMESPACE_ENV, ns)
    forbidding_apiserver.forbid(ns, GROUP, PLURAL)
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=READY_S), RUN_ID, export_uri="", namespace="",
               backend="trainjob", say=lambda _: None)  # fmt: skip
    line = str(err.value)
    assert line.startswith(
        f'InferenceService {ns}/{NAME}: forbidden (HTTP 403: inferenceservices.serving.kserve.io '
        f'"{NAME}" is forbidden: User "')
    assert line.endswith(
        f'" cannot patch resource "inferenceservices" in API group "serving.kserve.io" in the '
        f'namespace "{ns}"): grant the step\'s service account patch, get and watch on '
        "inferenceservices.serving.kserve.io in the namespace (manifests/standalone/rbac.yaml; "
        "in a profile namespace default-editor has them)")
    assert "\n" not in line


@pytest.mark.slow
# kfp.local warns that the steps' image is not this Python; running them here is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_compiled_pipeline_with_serve_kserve_trains_then_serves(cluster, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """serve=kserve through the compiled pipeline: the deploy step runs after train-gpt, on its
    run, and its address answers; the other three steps are today's."""
    from kfp import components, local
    from support.cluster.kfp_step import step_env, unresolved_run_id
    from support.runs import TINY_PIPELINE

    from pipeline.__main__ import COMPILED

    for name, value in step_env(COMPILED, cluster.namespace, RUN_ID).items():
        monkeypatch.setenv(name, value)
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
    pipeline = components.load_component_from_file(str(COMPILED))
    with unresolved_run_id():
        pipeline(backend="trainjob", root="/gpt", serve="kserve", serve_timeout=READY_S,
                 **TINY_PIPELINE)  # fmt: skip
    outputs = {p.parent.name: p for p in (tmp_path / "kfp").rglob("executor_output.json")}
    assert sorted(outputs) == ["deploy-model", "generative-prompt", "load-corpus", "train-gpt"]
    usage = (outputs["deploy-model"].parent / "usage").read_text()
    tokens = probe_tokens(TINY_PIPELINE["block_size"])  # 16 positions: 13 tokens after "The"
    reply = cli_replies(RunDir.of(cluster.pvc, RUN_ID), [PROBE_PROMPT], tokens)[0]
    assert f"It answered `{PROBE_PROMPT}` with:\n\n```text\n{reply}\n```" in usage
    assert cluster.inferenceservice(NAME)["metadata"]["labels"]["pipeline/runid"] == RUN_ID
