"""A Trainer-faithful test cluster: what Kubeflow Trainer, JobSet and the kubelet do with our
TrainJobs, played on the real test API server (tests/support/apiserver.py) with local processes.

The API server validates and stores TrainJobs and runtimes for real; this package plays the
controllers it lacks: cluster/controller.py (watch, JobSet and Job lifecycle, TrainJob status),
cluster/render.py (the Trainer's merge of a TrainJob into its runtime, the torch plugin's PET_*
env), cluster/kubelet.py (a pod as a process group, its mounts, network and log). Each rule cites
its upstream file. The step side reads the pods' logs through components/trainjob/podlogs.py's
`LogDirPodLogs` (`GPT_POD_LOG_DIR`), since the API server has no pods.

Not emulated (a real cluster may still differ here):
- images: the container runs this machine's Python; `image` is only looked up in the kubelet's
  registry (a set of names; unset, every image pulls), never pulled. Where the images are built
  (`make test-images`, tests/images/) the `run_images` fixture gives the kubelet them, and each
  container runs in its image's root filesystem as the pod's user (cluster/images.py);
- runAsUser/fsGroup (but with run_images), seccomp, capabilities, resource limits (no OOM
  kills, no GPUs), `tty` (stdin is a pipe nobody writes; no attach); scheduling is a request
  checked against one machine's capacity (no other pods' requests, affinity, taints);
- the pod status: only phase, PodScheduled and container `node`'s state; the kubelet's
  core/v1 Event recorder (repeats of one reason with other messages fold into one series);
- network isolation: pods share 127.0.0.1 (PET_MASTER_PORT is mapped to a port held for the
  attempt: cluster/controller.py `_reserve_port`);
- mounts: a PVC is a folder reached by rewriting the mount path (kubelet.py says how), one per
  (namespace, name): a pod whose namespace lacks the claim stays Pending, and a ReadWriteOnce
  claim attaches to one machine at a time (node index i on machine i); ReadWriteOncePod's
  one-pod rule is not played; emptyDir uses this machine's path;
- Trainer: initializer jobs, runtimePatches/podTemplateOverrides, suspend, managedBy, the
  webhook's validation (e.g. refusing PET_* in the TrainJob's env), the `Created` condition;
  JobSet: its webhook beyond names and failure-policy rules (cluster/jobset_webhook.py), the
  rules' onJobFailureMessagePatterns, targetReplicatedJobs and RestartJob actions,
  successPolicy, startupPolicy, coordinator, TTL; Job: backoffLimitPerIndex, exponential
  back-off between retries, the wait for a terminating pod before its replacement beyond the
  pod's own end; node-lifecycle delays (a lost node's pod fails at once, where a cluster waits
  for the unreachable toleration and may leave the pod terminating, kubernetes-sigs/jobset#576);
- Trainer's `TrainJobStatus` gate (cluster/render.py, cluster/statusserver.py): the token is
  written once (no rotation at 80% of its hour), the CA's ConfigMap is no API object, the
  status server's OIDC discovery, Go's path cleaning and HTTP/2 are not played;
- signals without root: the container's first process then runs in this machine's PID
  namespace, so SIGTERM ends it even without a handler (tests that depend on PID 1 skip).

KServe (`kserve_cluster`): KServe v0.20.0's InferenceService controller in raw-deployment mode
on the same namespace and PVC (cluster/kserve.py, its status rules in cluster/kserve_status.py),
its predictor a Deployment whose pod runs KServe's storage initializer and Hugging Face server
as local processes (cluster/predictor.py), reached at the cluster addresses KServe writes in
`status.url` and `status.address.url` through an HTTP proxy (cluster/services.py). It needs the
server's virtualenv, which `make test-serving` installs; its tests are marked `serving`, outside
`make test`. `kserve_cluster_without_images` needs none: its registry has no image, so no
predictor starts (for what fails before a server would run). Not emulated there: see
cluster/kserve.py. The API server itself behind RBAC: `forbidding_apiserver`
(cluster/frontdoor.py); without KServe's CRDs: `apiserver_without_kserve`.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.trainjob.podlogs import LOG_DIR_ENV
from support.cluster.controller import Cluster
from support.cluster.frontdoor import FrontDoor
from support.cluster.kserve import GROUP as KSERVE_GROUP
from support.cluster.kserve import PLURAL as KSERVE_PLURAL
from support.cluster.kserve import RUNTIME_VERSION, KServe
from support.cluster.kserve import VERSION as KSERVE_VERSION
from support.cluster.kubelet import Claim, Kubelet
from support.cluster.services import ServiceProxy
from support.paths import PROJECT

UPSTREAM_RUNTIME = Path("trainer-crds") / "v2.3.0" / "reference-torch_distributed_runtime.yaml"
# Two shared cores: one thread per process (torchrun sets it only for > 1 process per node).
NODE_ENV = {"OMP_NUM_THREADS": "1"}

# KServe's reference Hugging Face runtime, its image as KServe's release sets it (the file's is a
# placeholder its kustomization replaces).
KSERVE_RUNTIME = Path("kserve-crds") / "v0.20.0" / "reference-kserve-huggingfaceserver.yaml"
KSERVE_RUNTIME_IMAGE = "kserve/huggingfaceserver:v0.20.0"
# Where `make test-serving` installs KServe's Hugging Face server (../shared/peers/
# kserve-huggingfaceserver/install.sh; the Makefile's KSERVE_SERVER_VENV), with `.installed` in
# it once complete; the variable names another.
KSERVE_SERVER_VENV_ENV = "GPT_KSERVE_SERVER_VENV"
KSERVE_SERVER_VENV = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                      / "gpt-trainjobs" / "kserve-huggingfaceserver-v0.20.0")  # fmt: skip
# The predictor's time scale here (cluster/predictor.py): the kubelet's restart back-off (10 s
# first), and, kept short so that a test sees the server ready or failed within seconds, the
# readiness probe's period (KServe's is 10 s) and the Deployment's progress deadline (KServe's
# is 600 s: where the model fails to load, KServe says so at that deadline, cluster/kserve.py).
KSERVE_PROBE_PERIOD_S, KSERVE_BACKOFF_S, KSERVE_PROGRESS_DEADLINE_S = 1.0, 10.0, 20.0

__all__ = ["Claim", "Cluster", "FrontDoor", "KServeCluster", "Kubelet", "apiserver_without_kserve",
           "forbidding_apiserver", "kserve_cluster", "kserve_cluster_without_images",
           "kserve_server", "pvc", "run_images", "runtimes", "trainer_cluster",
           "trainer_feature_gates"]


def runtimes(shared: Path) -> list[dict]:
    """The project's three runtimes and the upstream `torch-distributed` one."""
    paths = [*sorted(PROJECT.glob("runtimes/gpt-*.yaml")), shared / UPSTREAM_RUNTIME]
    return [yaml.safe_load(p.read_text()) for p in paths]


@pytest.fixture
def run_images() -> dict | None:
    """The built images the kubelet runs containers in, by name; None: this machine's venv
    (tests/images/conftest.py overrides it with the images `make test-images` builds)."""
    return None


@pytest.fixture
def trainer_feature_gates() -> frozenset[str]:
    """The Trainer's feature gates that are on: none, as v2.3.0 ships; a test turns one on by
    parametrizing this fixture (`TrainJobStatus`: cluster/statusserver.py)."""
    return frozenset()


@pytest.fixture
def trainer_cluster(shared, apiserver, custom_api, tmp_path, monkeypatch, run_images,
                    trainer_feature_gates) -> Iterator[Cluster]:  # fmt: skip
    """A cluster serving a fresh namespace, its PVC `gpt-pvc` = `tmp_path/pvc`; the step side's
    kube config and pod logs point at it. Stopped (its pods deleted) at the end, where an error
    of the cluster itself (not of a TrainJob) fails the test."""
    from support.apiserver import apply_cluster_object, namespace

    for runtime in runtimes(shared):
        apply_cluster_object(custom_api, runtime)
    (tmp_path / "pvc").mkdir()
    ns = namespace()
    # ReadWriteOnce, as manifests/base/pvc.yaml makes it.
    kubelet = Kubelet(tmp_path / "pods", {(ns, "gpt-pvc"): Claim(tmp_path / "pvc")}, NODE_ENV,
                      run_images=run_images)  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(apiserver.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv(LOG_DIR_ENV, str(kubelet.logs))
    cluster = Cluster(custom_api, ns, kubelet, trainer_feature_gates)
    yield cluster
    cluster.shutdown()
    assert not cluster.errors(), "the test cluster itself failed"


@pytest.fixture
def pvc(trainer_cluster) -> Path:
    """The folder that is PVC gpt-pvc (/gpt in the pods), made ReadWriteMany as a multi-node
    train needs (docs/cluster.md)."""
    folder = trainer_cluster.kubelet.claims[(trainer_cluster.namespace, "gpt-pvc")].folder
    trainer_cluster.kubelet.bind(trainer_cluster.namespace, "gpt-pvc",
                                 Claim(folder, ("ReadWriteMany",)))  # fmt: skip
    return folder


def kserve_runtime(shared: Path) -> dict:
    """KServe's `kserve-huggingfaceserver` ClusterServingRuntime, as KServe installs it."""
    runtime = yaml.safe_load((shared / KSERVE_RUNTIME).read_text())
    for container in runtime["spec"]["containers"]:
        container["image"] = KSERVE_RUNTIME_IMAGE
    return runtime


@pytest.fixture(scope="session")
def kserve_server() -> Path:
    """The Python of KServe's Hugging Face server's virtualenv; the test skips, saying so,
    where it is not installed (`make test-serving` installs it)."""
    venv = Path(os.environ.get(KSERVE_SERVER_VENV_ENV) or KSERVE_SERVER_VENV)
    if not (venv / ".installed").is_file():
        pytest.skip(f"KServe's Hugging Face server is not installed in {venv}: "
                    "make test-serving installs it (from ../shared/peers)")  # fmt: skip
    return venv / "bin" / "python"


@dataclass
class KServeCluster:
    """The test cluster with KServe: what a test of the deploy step needs."""

    api: Any
    """A `CustomObjectsApi` on the test API server."""
    namespace: str
    kubeconfig: Path
    """The API server's kube config (KUBECONFIG points at it during the test)."""
    pvc: Path
    """The folder that is PVC `gpt-pvc` (/gpt in the TrainJobs' pods) in `namespace`."""
    controller: KServe
    """KServe's controller: its predictors (`predictor(name)`: pods, their status and logs),
    the namespace's ServiceAccounts and Secrets (`service_accounts`, `secrets`: a test's, for
    the storage initializer's credentials)."""
    proxy: ServiceProxy
    """What the cluster's Service addresses reach through (`http_proxy` during the test)."""

    def inferenceservice(self, name: str) -> dict:
        return self.api.get_namespaced_custom_object(KSERVE_GROUP, KSERVE_VERSION,
                                                     self.namespace, KSERVE_PLURAL, name)

    def crash_looping(self, name: str) -> bool:
        """Whether the predictor pod's kserve-container waits in CrashLoopBackOff (its server
        exited, the kubelet backs off from restarting it)."""
        deployment = self.controller.deployments.get(name)
        if deployment is None or deployment.current is None:
            return False
        (main,) = deployment.current.status()["containerStatuses"]
        return main["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"

    def touch(self, name: str) -> None:
        """Change the InferenceService (an annotation), which brings KServe's next reconcile:
        nothing KServe watches changes when a container crashes, so a load failure shows in
        `modelStatus` only at such a reconcile (the Deployment's progress deadline, or this)."""
        self.api.patch_namespaced_custom_object(
            KSERVE_GROUP, KSERVE_VERSION, self.namespace, KSERVE_PLURAL, name,
            {"metadata": {"annotations": {"test-cluster/touched": str(time.time())}}})


@pytest.fixture
def kserve_cluster(trainer_cluster, kserve_api, kserve_server, shared, apiserver, tmp_path,
                   monkeypatch) -> Iterator[KServeCluster]:  # fmt: skip
    """`trainer_cluster` with KServe: its CRDs and the `kserve-huggingfaceserver`
    ClusterServingRuntime applied, its controller watching the namespace, the cluster's Service
    and Ingress hosts reached through `http_proxy`. Stopped at the end (its predictor pods
    deleted), where an error of the cluster itself fails the test."""
    with _kserve(trainer_cluster, kserve_api, shared, apiserver, tmp_path, monkeypatch,
                 kserve_server, None) as cluster:  # fmt: skip
        yield cluster


@pytest.fixture
def kserve_cluster_without_images(trainer_cluster, kserve_api, shared, apiserver, tmp_path,
                                  monkeypatch) -> Iterator[KServeCluster]:  # fmt: skip
    """`kserve_cluster` whose registry has no image: every predictor pod waits in
    ErrImagePull/ImagePullBackOff, never Ready, and no server runs (so it needs none
    installed: for the failures that come before a server, or instead of one)."""
    with _kserve(trainer_cluster, kserve_api, shared, apiserver, tmp_path, monkeypatch,
                 Path("/nonexistent/python"), set()) as cluster:  # fmt: skip
        yield cluster


@contextlib.contextmanager
def _kserve(trainer_cluster, kserve_api, shared: Path, apiserver, tmp_path: Path, monkeypatch,
            python: Path, images: set[str] | None) -> Iterator[KServeCluster]:  # fmt: skip
    from support.apiserver import apply_cluster_object

    apply_cluster_object(kserve_api, kserve_runtime(shared), "clusterservingruntimes",
                         group=KSERVE_GROUP, version=RUNTIME_VERSION)  # fmt: skip
    ns = trainer_cluster.namespace
    claims = trainer_cluster.kubelet.claims
    controller = KServe(
        kserve_api, ns, lambda namespace, name: (claims[(namespace, name)].folder
                                                 if (namespace, name) in claims else None),
        tmp_path / "kserve-pods", python, events=trainer_cluster.kubelet.logs, images=images,
        probe_period_s=KSERVE_PROBE_PERIOD_S,
        backoff_s=KSERVE_BACKOFF_S, progress_deadline_s=KSERVE_PROGRESS_DEADLINE_S)  # fmt: skip
    proxy = ServiceProxy(controller.address)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    try:
        yield KServeCluster(kserve_api, ns, apiserver.kubeconfig, claims[(ns, "gpt-pvc")].folder,
                            controller, proxy)  # fmt: skip
    finally:
        proxy.stop()
        controller.shutdown()
        # urlopen's process-wide opener keeps the proxies of its first call: one made during
        # this test would send a later test's localhost requests to the stopped proxy (no_proxy,
        # read per request, is gone by then). The next urlopen builds a new one.
        urllib.request.install_opener(None)
    assert not controller.errors, f"the test cluster's KServe failed: {controller.errors}"


@pytest.fixture
def forbidding_apiserver(trainer_cluster, kserve_api, apiserver,
                         monkeypatch) -> Iterator[FrontDoor]:  # fmt: skip
    """The test API server behind RBAC (cluster/frontdoor.py): KUBECONFIG reaches it through a
    front door whose `forbid(namespace, group, resource)` denies a resource there as the API
    server does (403 Forbidden, for the step's service account). The test cluster's
    controllers keep the API server's own access."""
    door = FrontDoor(apiserver.workdir, apiserver.url)
    monkeypatch.setenv("KUBECONFIG", str(door.kubeconfig))
    yield door
    door.stop()


@pytest.fixture
def apiserver_without_kserve(shared, apiserver, tmp_path, monkeypatch):
    """A test API server of its own, with the Trainer's CRDs and none of KServe's (a cluster
    where KServe is not installed); KUBECONFIG points at it. (The session's server's binaries:
    start.sh unpacks none.)"""
    from support.apiserver import running

    bin_ = apiserver.workdir / "bin"
    monkeypatch.setenv("APISERVER", str(bin_ / "apiextensions-apiserver"))
    monkeypatch.setenv("ETCD", str(bin_ / "etcd"))
    with running(shared, tmp_path / "apiserver-without-kserve") as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield server
