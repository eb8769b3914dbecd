"""The Kubeflow SDK's `TrainerClient` (PyPI `kubeflow` 0.5.0) lists and reads our runtimes and
TrainJobs, as a user of Kubeflow Trainer would inspect them.

What the SDK reads, kubeflow/trainer/backends/kubernetes/backend.py and utils.py at 0.5.0:
- `TrainerClient()`: the ConfigMap `kubeflow-system/kubeflow-trainer-public` (core API); a
  failure is only a logged warning;
- `list_runtimes` / `get_runtime`: TrainingRuntimes in the namespace, then
  ClusterTrainingRuntimes (custom objects only); a runtime without the label
  `trainer.kubeflow.org/framework` is skipped with a warning, and its trainer is the container
  `node` of the replicatedJob labelled `trainer.kubeflow.org/trainjob-ancestor-step`
  (utils.py `get_runtime_trainer_container`);
- `get_job` / `list_jobs` / `wait_for_job_status`: the TrainJob (custom object), its runtime,
  then always the core API: pods by `jobset.sigs.k8s.io/jobset-name=<job>,
  jobset.sigs.k8s.io/replicatedjob-name in (...)` for its steps (`node-<completion index>`,
  container `node`); an error there fails the whole call;
- `get_job_logs`: those pods, then `pods/log` of container `node`; `get_job_events`: those
  pods, then the namespace's Events.
The test API server has no core API group, so all but the runtimes are shown against
`CoreV1Pods` below: the test cluster's pods and Events (tests/support/cluster/) served as core/v1
would serve them; the last test shows the SDK without it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from support.cluster import runtimes
from support.cluster.events import EVENTS_DIR
from support.cluster.jobset_webhook import POD_NAME_TOO_LONG
from support.cluster.render import NODE, render

from components.step.dispatch import run_stage
from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobSpec, build_trainjob
from components.trainjob.placement import Placement
from gpt.stages import STAGES

pytestmark = pytest.mark.apiserver

OUR_RUNTIMES = {stage.runtime for stage in STAGES.values()}


def trainer_client(apiserver, namespace: str):
    """A `TrainerClient` on the test server, from its kube config (the process's default
    configuration is left alone)."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(apiserver.kubeconfig), client_configuration=cfg)
    return TrainerClient(KubernetesBackendConfig(namespace=namespace, client_configuration=cfg))


def test_trainer_client_lists_our_runtimes_by_their_framework(shared, apiserver, custom_api):
    from kubeflow.trainer.constants.constants import TORCH_COMMAND
    from support.apiserver import apply_cluster_object

    for runtime in runtimes(shared):
        apply_cluster_object(custom_api, runtime)
    sdk = trainer_client(apiserver, "any")
    listed = {r.name: r for r in sdk.list_runtimes()}
    assert OUR_RUNTIMES | {"torch-distributed"} <= listed.keys()
    for runtime in (r for r in runtimes(shared) if r["metadata"]["name"] in OUR_RUNTIMES):
        name = runtime["metadata"]["name"]
        (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
        for seen in (listed[name], sdk.get_runtime(name)):
            assert seen.kind.value == "ClusterTrainingRuntime"
            # Read from our label, our ancestor-labelled replicatedJob and its container `node`.
            assert seen.trainer.framework == "torch"
            assert seen.trainer.image == container["image"]
            assert seen.trainer.num_nodes == runtime["spec"]["mlPolicy"]["numNodes"] == 1
            assert seen.trainer.trainer_type.value == "CustomTrainer"
            # The torch mlPolicy: the SDK would wrap a CustomTrainer's function in torchrun.
            assert seen.trainer.command == TORCH_COMMAND


@pytest.mark.slow
def test_trainer_client_reads_a_trainjob_the_launcher_ran_and_its_status(
    trainer_cluster, apiserver
):
    ns = trainer_cluster.namespace
    core = CoreV1Pods(trainer_cluster)
    sdk = trainer_client(apiserver, ns)
    sdk.backend.core_api = core.api()  # the same client, its core calls sent to the pods here
    while_running = []

    def look(obj: dict) -> None:
        # The Trainer copied the JobSet's jobsStatus, no condition yet: the SDK derives
        # Running from the pods (all nodes Running or Succeeded).
        if obj.get("status", {}).get("jobsStatus") and not obj["status"].get("conditions"):
            while_running.append(sdk.get_job(obj["metadata"]["name"]).status)

    values = {"root": "/gpt", "run": "sdk", "tokenizer": "char", "block_size": 16}
    files = run_stage("load-corpus", values, Placement(timeout=120), backend="trainjob",
                      image="gpt-workload:t", namespace=ns, on_update=look,
                      say=lambda _: None)  # fmt: skip
    assert "data/meta.json" in files
    (name,) = trainer_cluster.runs
    (pod,) = trainer_cluster.runs[name].pods

    job = sdk.get_job(name)
    assert while_running == ["Running"]
    assert (job.name, job.status, job.num_nodes) == (name, "Complete", 1)
    assert (job.runtime.name, job.runtime.trainer.framework) == ("gpt-load-corpus", "torch")
    ((step_name, status, pod_name, procs),) = [
        (s.name, s.status, s.pod_name, s.device_count) for s in job.steps
    ]
    assert (step_name, status, pod_name, procs) == ("node-0", "Succeeded", pod.name, "1")
    assert [j.name for j in sdk.list_jobs()] == [name]
    assert [j.name for j in sdk.list_jobs(runtime=sdk.get_runtime("gpt-train-gpt"))] == []
    assert sdk.wait_for_job_status(name, timeout=4, polling_interval=1).status == "Complete"
    # Node 0's log through pods/log of container `node`, plain and followed.
    assert list(sdk.get_job_logs(name)) == pod.log.splitlines()
    assert list(sdk.get_job_logs(name, follow=True)) == pod.log.splitlines()
    assert any(r.startswith(f"/api/v1/namespaces/{ns}/pods/{pod.name}/log?") and
               "container=node" in r for r in core.requests)  # fmt: skip


def test_a_trainjob_whose_jobset_is_refused_stays_created_and_the_sdk_cannot_say_why(
    trainer_cluster, apiserver
):
    """What the SDK shows of the TrainJob 12ee68a made of a KFP run (a name JobSet refuses):
    no condition ever, so `Created` for good; `wait_for_job_status` would wait its whole
    timeout. Trainer v2.3 says why only in an events.k8s.io/v1 Event (cluster/events.py), which
    has no `firstTimestamp`, and `get_job_events` (backend.py) skips every Event without one:
    the SDK shows nothing, where
    components/trainjob/warning_events.py (the launcher's START_GRACE_S) reads it."""
    from components.trainjob.warning_events import LogDirEvents

    ns = trainer_cluster.namespace
    # 12ee68a's `<stage>-<run>-<6 hex>` for a KFP run id: 53 characters, 68 for its pod names.
    name = f"train-gpt-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}-abc123"
    spec = TrainJobSpec(stage="train-gpt", runtime="gpt-train-gpt", image="i", command=["true"])
    created = trainer_cluster.api.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, build_trainjob(spec, name, ns, "r"))
    ours = LogDirEvents(trainer_cluster.kubelet.logs)
    warnings = []
    for _ in range(100):  # the test's own wait for the Trainer's first Event
        if warnings := ours.warnings(ns, "TrainJob", name, created["metadata"]["uid"]):
            break
        time.sleep(0.1)
    assert warnings and warnings[-1].reason == "TrainJobResourcesCreationFailed"
    assert POD_NAME_TOO_LONG in warnings[-1].message
    sdk = trainer_client(apiserver, ns)
    sdk.backend.core_api = CoreV1Pods(trainer_cluster).api()
    job = sdk.get_job(name)
    assert (job.status, job.steps) == ("Created", [])
    assert sdk.get_job_events(name) == []


def test_without_the_core_api_get_job_fails_on_the_pods_it_lists(trainer_cluster, apiserver):
    """What cannot be shown on the test server alone: every read of a TrainJob lists its pods."""
    from kubernetes.client.rest import ApiException

    ns = trainer_cluster.namespace
    body = {"metadata": {"name": "j-sdk", "namespace": ns},
            "spec": {"runtimeRef": {"name": "gpt-load-corpus"}, "trainer": {"command": ["true"]}}}
    trainer_cluster.api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                        {"apiVersion": f"{GROUP}/{VERSION}",
                                                         "kind": "TrainJob", **body})  # fmt: skip
    sdk = trainer_client(apiserver, ns)
    with pytest.raises(RuntimeError, match=f"Failed to list TrainJob's steps: {ns}/j-sdk") as e:
        sdk.get_job("j-sdk")
    assert isinstance(e.value.__cause__, ApiException) and e.value.__cause__.status == 404
    with pytest.raises(RuntimeError, match="Failed to list TrainJobs"):
        sdk.list_jobs()


# ---- the core API's pods, for the SDK ------------------------------------------------------------


class CoreV1Pods(ThreadingHTTPServer):
    """The test cluster's pods and Events as core/v1 serves them: `GET pods?labelSelector=`
    (equality and `in` requirements, k8s.io/apimachinery pkg/labels/selector.go), `GET
    pods/<pod>/log` (the current file; a follow of an ended container returns it and closes, as
    the kubelet does) and `GET events` (cluster/events.py's files). A pod is what its JobSet
    and the kubelet made: the labels kubelet.py gives it, the spec the Trainer renders from the
    stored TrainJob and runtime (cluster/render.py), the container's env as the pod got it,
    phase Running until its container exits (then Succeeded or Failed). Everything else is
    404, as on the test API server."""

    def __init__(self, cluster):
        self.cluster, self.requests = cluster, []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def api(self):
        from kubernetes import client

        cfg = client.Configuration(host=f"http://127.0.0.1:{self.server_address[1]}")
        return client.CoreV1Api(client.ApiClient(cfg))

    def pods(self, namespace: str, selector: str) -> list[dict]:
        wanted = _selector(selector)
        found = []
        for folder in sorted((self.cluster.kubelet.logs / namespace).glob("*/labels.json")):
            labels = json.loads(folder.read_text())
            if all(labels.get(k) in values for k, values in wanted.items()):
                found.append(self._pod(namespace, folder.parent, labels))
        return found

    def _pod(self, namespace: str, folder: Path, labels: dict) -> dict:
        trainjob = self.cluster.api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, labels["jobset.sigs.k8s.io/jobset-name"])
        runtime = self.cluster.api.get_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", trainjob["spec"]["runtimeRef"]["name"])
        spec = render(trainjob, runtime).pod_spec
        env = json.loads((folder / "pod.json").read_text())["env"]
        for container in spec["containers"]:
            if container["name"] == NODE:
                container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        exit_file = folder / f"{NODE}.exit"
        phase = "Running"
        if exit_file.exists():
            phase = "Succeeded" if exit_file.read_text().strip() == "0" else "Failed"
        created = datetime.fromtimestamp((folder / "labels.json").stat().st_mtime, UTC)
        return {"metadata": {"name": folder.name, "namespace": namespace, "labels": labels,
                             "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
                "spec": spec, "status": {"phase": phase}}  # fmt: skip


def _selector(text: str) -> dict[str, set[str]]:
    """`k=v` and `k in (a, b)` requirements, comma-separated."""
    wanted = {}
    for key, values, value in re.findall(r"([^,=\s]+)\s*(?:in\s*\(([^)]*)\)|==?\s*([^,]*))",
                                         text):  # fmt: skip
        wanted[key] = {v.strip() for v in values.split(",")} if values else {value.strip()}
    return wanted


class _Handler(BaseHTTPRequestHandler):
    server: CoreV1Pods

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path):
            items = self.server.pods(m[1], query.get("labelSelector", ""))
            return self._send(200, "application/json", json.dumps(
                {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}))
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", url.path):
            folder = self.server.cluster.kubelet.logs / m[1] / EVENTS_DIR
            items = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
            return self._send(200, "application/json", json.dumps(
                {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", url.path)
        folder = m and self.server.cluster.kubelet.logs / m[1] / m[2]
        if folder and query.get("container") == NODE and (folder / f"{NODE}.log").exists():
            return self._send(200, "text/plain", (folder / f"{NODE}.log").read_text())
        self._send(404, "application/json", json.dumps(
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
             "reason": "NotFound", "message": "the server could not find the requested resource"}))

    def _send(self, code: int, kind: str, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
