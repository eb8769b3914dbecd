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
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.trainjob.podlogs import LOG_DIR_ENV
from support.cluster.controller import Cluster
from support.cluster.kubelet import Claim, Kubelet
from support.paths import PROJECT

UPSTREAM_RUNTIME = Path("trainer-crds") / "v2.3.0" / "reference-torch_distributed_runtime.yaml"
# Two shared cores: one thread per process (torchrun sets it only for > 1 process per node).
NODE_ENV = {"OMP_NUM_THREADS": "1"}

__all__ = ["Claim", "Cluster", "Kubelet", "pvc", "run_images", "runtimes", "trainer_cluster",
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
