"""An InferenceService's predictor in raw-deployment mode: the Deployment KServe creates, as
Kubernetes' Deployment controller and the kubelet run it, its containers KServe's own code run
as local processes of the Hugging Face server's virtualenv (`make test-serving` installs it).

The pod (kubernetes pkg/kubelet, as kubelet.py models it for TrainJobs):
- a claim its `pvc://` storageUri names that is not in the namespace leaves it unscheduled
  (kubernetes pkg/scheduler/framework/plugins/volumebinding/volume_binding.go, PreFilter:
  PodScheduled False, `persistentvolumeclaim "<claim>" not found`), no container started;
- its image is looked up in the registry (`images`; None: every image pulls); one the registry
  lacks never starts: its containers wait ErrImagePull, then (after kubelet.py's short image
  back-off) ImagePullBackOff (pkg/kubelet/images/image_manager.go), and the pod stays Pending;
- init container `storage-initializer` (where KServe's storage initializer injector adds one: a
  storageUri that is not `pvc://`) runs KServe's storage code, `kserve_storage.Storage
  .download_files(uris, dirs)` as python/storage-initializer/scripts/initializer-entrypoint
  calls it, into the pod's folder standing for the emptyDir at /mnt/models; its failure exits 1
  and is retried with the restart back-off (restartPolicy Always), the container then waiting in
  CrashLoopBackOff (pkg/kubelet/kuberuntime/kuberuntime_manager.go, doBackOff);
- `kserve-container` runs `python -m huggingfaceserver` with the runtime's and the
  InferenceService's args. /mnt/models, where the server reads the model (its `--model_dir`
  default), is reached by adding `--model_dir <folder>`: the claim's folder and path for
  `pvc://<claim>/<path>` (mounted read-only at /mnt/models with subPath `<path>`: KServe's
  storage_initializer_injector.go), else the storage initializer's folder. The pods share this
  machine's network, so the server's HTTP and gRPC ports (8080 and 8081 in the pod) are free
  ports of this machine (`--http_port`, `--grpc_port` added last), and the Service's cluster
  address reaches the HTTP one (cluster/services.py);
- the readiness probe KServe's deployment reconciler gives `kserve-container` (a TCP connect
  to its port, reconcilers/deployment/deployment_reconciler.go setDefaultPodSpec) every
  `probe_period_s` (KServe's periodSeconds is 10; kept short here as kubelet.py keeps the image
  back-off short); the pod is Ready while it passes;
- a container that exits is `terminated` (reason Error, or Completed for 0; no message: the
  servers write no /dev/termination-log) and restarted after the back-off (10 s doubling to
  300 s, pkg/kubelet/kubelet.go backOffPeriod and MaxContainerBackOff; here `backoff_s`
  doubling), waiting in CrashLoopBackOff meanwhile, its `lastState` the termination.

The Deployment (kubernetes pkg/controller/deployment, one replica, KServe's RollingUpdate of
25% / 25%: no pod unavailable, one surge pod): a new pod template is a new ReplicaSet
`<deployment>-<pod-template-hash>` and its pod, the old pod deleted once the new one is
available. Its conditions: sync.go (getNewReplicaSet: Progressing True NewReplicaSetCreated
`Created new replica set "<rs>"`; calculateStatus: Available True MinimumReplicasAvailable
"Deployment has minimum availability." or False MinimumReplicasUnavailable "Deployment does not
have minimum availability.") and progress.go (syncRolloutStatus: ReplicaSetUpdated
`ReplicaSet "<rs>" is progressing.` while it progresses, NewReplicaSetAvailable `ReplicaSet
"<rs>" has successfully progressed.` once complete, Progressing False ProgressDeadlineExceeded
`ReplicaSet "<rs>" has timed out progressing.` past progressDeadlineSeconds without progress:
KServe's 600 s, `progress_deadline_s` here).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.cluster.kserve_status import (
    AVAILABLE,
    KSERVE_CONTAINER,
    PROGRESSING,
    STORAGE_INITIALIZER,
    now,
)
from support.cluster.kubelet import IMAGE_BACKOFF_S

# kubernetes staging/src/k8s.io/apimachinery/pkg/util/rand/rand.go: SafeEncodeString's alphabet.
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
# KServe's storage initializer entrypoint, as python/storage-initializer/scripts/
# initializer-entrypoint runs it (its confidential-serving decryption left out).
STORAGE_INITIALIZER_MAIN = """\
import os, sys
from kserve_storage import Storage
from kserve_storage.logging import configure_logging, logger
configure_logging()
uris, dirs = sys.argv[1::2], sys.argv[2::2]
for d in dirs:
    os.makedirs(d, exist_ok=True)
try:
    Storage.download_files(uris, dirs)
except Exception as e:
    logger.error("Storage initialization failed: %s", e)
    sys.exit(1)
"""
STOP_GRACE_S = 30  # the pod's terminationGracePeriodSeconds (setDefaultPodSpec)


@dataclass(frozen=True)
class PodTemplate:
    """What the predictor's pod runs, as KServe's controller rendered it."""

    image: str
    args: tuple[str, ...]
    """kserve-container's args: the runtime's, then the InferenceService's, placeholders
    replaced."""
    env: tuple[tuple[str, str], ...]
    storage_uri: str
    model_dir: Path | None
    """The folder that is /mnt/models for a `pvc://` storageUri; None: the storage initializer
    fills the pod's own."""
    unschedulable: str = ""
    """Why the scheduler cannot place the pod (a claim that is not there), or ""."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _safe_hash(text: str, length: int = 10) -> str:
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    out = ""
    for _ in range(length):
        digest, i = divmod(digest, len(_SAFE))
        out += _SAFE[i]
    return out


@dataclass
class _Container:
    """One container's status as the kubelet reports it (core/v1 ContainerStatus)."""

    name: str
    image: str
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False

    def as_status(self) -> dict[str, Any]:
        return {"name": self.name, "image": self.image, "ready": self.ready,
                "restartCount": self.restarts, "started": "running" in self.state,
                "state": self.state, "lastState": self.last_state}  # fmt: skip


class PredictorPod(threading.Thread):
    """One pod of the predictor's ReplicaSet, from its image pull to its deletion."""

    def __init__(self, name: str, namespace: str, template: PodTemplate, folder: Path,
                 python: Path, images: set[str] | None, probe_period_s: float,
                 backoff_s: float):  # fmt: skip
        super().__init__(daemon=True, name=f"pod-{name}")
        self.pod_name, self.namespace, self.template = name, namespace, template
        self.folder, self.python, self.images = folder, python, images
        self.probe_period_s, self.backoff_s = probe_period_s, backoff_s
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.model_dir = template.model_dir or folder / "mnt-models"
        self.init = (_Container(STORAGE_INITIALIZER, template.image)
                     if template.model_dir is None else None)  # fmt: skip
        self.main = _Container(KSERVE_CONTAINER, template.image)
        if self.init is None:
            self.main.state = {"waiting": {"reason": "ContainerCreating"}}
        self.phase = "Pending"
        self.lock = threading.Lock()
        self.deleted = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.error: BaseException | None = None
        folder.mkdir(parents=True)

    @property
    def ready(self) -> bool:
        return self.main.ready

    def base_env(self) -> dict[str, str]:
        """What a container's process has besides the spec's env: an image's PATH and HOME
        (here the virtualenv's and the pod's folder), none of this machine's variables (its
        AWS keys, its proxies); one OpenMP thread on the shared cores."""
        home = self.folder / "home"
        home.mkdir(exist_ok=True)
        return {"PATH": f"{self.python.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
                "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}

    def status(self) -> dict[str, Any]:
        """The pod's core/v1 PodStatus: phase, Ready, the containers' statuses (none while it
        is not scheduled: PodScheduled False)."""
        if self.template.unschedulable:
            return {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": self.template.unschedulable}]}  # fmt: skip
        with self.lock:
            status: dict[str, Any] = {
                "phase": self.phase,
                "conditions": [{"type": "Ready", "status": str(self.main.ready)}],
                "containerStatuses": [self.main.as_status()],
            }
            if self.init is not None:
                status["initContainerStatuses"] = [self.init.as_status()]
            return status

    def log(self, container: str = KSERVE_CONTAINER) -> str:
        path = self.folder / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self) -> None:
        try:
            if self.template.unschedulable:
                return  # it waits for the scheduler, and nothing here changes that
            if self.images is not None and self.template.image not in self.images:
                return self._pull_back_off()
            if self.init is not None:
                argv = [str(self.python), "-c", STORAGE_INITIALIZER_MAIN,
                        self.template.storage_uri, str(self.model_dir)]  # fmt: skip
                if not self._run_to_success(self.init, argv):
                    return
            with self.lock:
                self.phase = "Running"
            argv = [str(self.python), "-m", "huggingfaceserver", *self.template.args,
                    f"--model_dir={self.model_dir}", f"--http_port={self.http_port}",
                    f"--grpc_port={self.grpc_port}"]  # fmt: skip
            self._run_to_success(self.main, argv, probe=True)
        except BaseException as e:  # noqa: BLE001  (surfaced by the test through errors())
            self.error = e

    def _pull_back_off(self) -> None:
        image = self.template.image
        error = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                 f'failed to resolve reference "{image}": {image}: not found')
        with self.lock:
            for c in filter(None, (self.init, self.main)):
                c.state = {"waiting": {"reason": "ErrImagePull", "message": error}}
        if self.deleted.wait(IMAGE_BACKOFF_S):
            return
        with self.lock:
            for c in filter(None, (self.init, self.main)):
                c.state = {"waiting": {"reason": "ImagePullBackOff",
                                       "message": f'Back-off pulling image "{image}"'}}  # fmt: skip

    def _run_to_success(self, container: _Container, argv: list[str], probe: bool = False) -> bool:
        """Run `container` until it exits 0 (True), restarting it after each failure with the
        back-off; False once the pod is deleted."""
        backoff = self.backoff_s
        while not self.deleted.is_set():
            env = {**self.base_env(), **dict(self.template.env)}
            with open(self.folder / f"{container.name}.log", "ab") as log:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)  # fmt: skip
            started = now()
            with self.lock:
                container.state = {"running": {"startedAt": started}}
            code = self._wait(probe)
            if code is None:
                return False
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": started, "finishedAt": now()}  # fmt: skip
            with self.lock:
                container.ready = False
                container.state = {"terminated": terminated}
            if code == 0:
                return True
            if self.deleted.wait(1.0):  # the kubelet's next sync of the pod
                return False
            with self.lock:
                container.last_state = {"terminated": terminated}
                container.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    f"back-off {backoff:g}s restarting failed container={container.name} "
                    f"pod={self.pod_name}_{self.namespace}")}}  # fmt: skip
            if self.deleted.wait(backoff):
                return False
            backoff = min(backoff * 2, 300)
            with self.lock:
                container.restarts += 1
        return False

    def _wait(self, probe: bool) -> int | None:
        """The container's exit code, probing its readiness meanwhile; None if deleted."""
        next_probe = time.monotonic()
        while self.proc.poll() is None:
            if self.deleted.is_set():
                return None
            if probe and time.monotonic() >= next_probe:
                next_probe += self.probe_period_s
                with socket.socket() as s:
                    s.settimeout(1)  # timeoutSeconds
                    passed = s.connect_ex(("127.0.0.1", self.http_port)) == 0
                with self.lock:
                    self.main.ready = passed
            time.sleep(0.05)
        return self.proc.returncode

    def delete(self) -> None:
        """SIGTERM to the container's processes, SIGKILL after the grace period."""
        self.deleted.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.join(10)


class Deployment:
    """The predictor's Deployment, its ReplicaSets' pods and its status, for one replica."""

    def __init__(self, name: str, namespace: str, pods_folder: Path, python: Path,
                 images: set[str] | None, probe_period_s: float, backoff_s: float,
                 progress_deadline_s: float):  # fmt: skip
        self.name, self.namespace, self.pods_folder = name, namespace, pods_folder
        self.python, self.images = python, images
        self.probe_period_s, self.backoff_s = probe_period_s, backoff_s
        self.progress_deadline_s = progress_deadline_s
        self.template: PodTemplate | None = None
        self.generation = 0
        self.replica_set = ""
        self.pods: list[PredictorPod] = []
        """Every pod it still has, the newest ReplicaSet's last."""
        self.conditions: dict[str, dict[str, Any]] = {}
        self._progress_at = 0.0
        self._ready_seen = -1

    @property
    def current(self) -> PredictorPod | None:
        return self.pods[-1] if self.pods else None

    def apply(self, template: PodTemplate) -> None:
        """A changed pod template: a new ReplicaSet and its pod (the old one stays until the
        new one is available: maxUnavailable 0)."""
        if template == self.template:
            return
        self.template = template
        self.generation += 1
        self.replica_set = f"{self.name}-{_safe_hash(repr(template))}"
        suffix = "".join(secrets.choice(_SAFE) for _ in range(5))
        name = f"{self.replica_set}-{suffix}"
        pod = PredictorPod(name, self.namespace, template, self.pods_folder / name, self.python,
                           self.images, self.probe_period_s, self.backoff_s)  # fmt: skip
        self.pods.append(pod)
        pod.start()
        self._set(PROGRESSING, "True", "NewReplicaSetCreated",
                  f'Created new replica set "{self.replica_set}"')  # fmt: skip
        self._progress_at = time.monotonic()
        self._ready_seen = -1

    def sync(self) -> dict[str, Any]:
        """One sync of the Deployment controller: roll out, then the status."""
        new = self.current
        ready = int(new is not None and new.ready)
        for old in self.pods[:-1]:
            if ready:  # the new pod is available: the old ReplicaSet scales down
                old.delete()
                self.pods.remove(old)
        available = any(p.ready for p in self.pods)
        if available:
            self._set(AVAILABLE, "True", "MinimumReplicasAvailable",
                      "Deployment has minimum availability.")  # fmt: skip
        else:
            self._set(AVAILABLE, "False", "MinimumReplicasUnavailable",
                      "Deployment does not have minimum availability.")  # fmt: skip
        progressing = self.conditions.get(PROGRESSING, {})
        if progressing.get("reason") != "NewReplicaSetAvailable":  # a rollout not complete
            if ready and len(self.pods) == 1:
                self._set(PROGRESSING, "True", "NewReplicaSetAvailable",
                          f'ReplicaSet "{self.replica_set}" has successfully progressed.')
            elif ready > self._ready_seen:  # progress: a pod created, or one became ready
                self._ready_seen = ready
                self._progress_at = time.monotonic()
                self._set(PROGRESSING, "True", "ReplicaSetUpdated",
                          f'ReplicaSet "{self.replica_set}" is progressing.')
            elif (time.monotonic() - self._progress_at > self.progress_deadline_s
                  and progressing.get("status") == "True"):
                self._set(PROGRESSING, "False", "ProgressDeadlineExceeded",
                          f'ReplicaSet "{self.replica_set}" has timed out progressing.')
        return self.status()

    def _set(self, kind: str, status: str, reason: str, message: str) -> None:
        """util.SetDeploymentCondition: the transition time kept while the status is."""
        old = self.conditions.get(kind)
        if old and (old["status"], old["reason"]) == (status, reason):
            return
        at = old["lastTransitionTime"] if old and old["status"] == status else now()
        self.conditions[kind] = {"type": kind, "status": status, "reason": reason,
                                 "message": message, "lastTransitionTime": at}  # fmt: skip

    def status(self) -> dict[str, Any]:
        """The Deployment as the controller reads it: its generation and status."""
        ready = sum(p.ready for p in self.pods)
        return {"metadata": {"name": self.name, "generation": self.generation},
                "status": {"observedGeneration": self.generation, "replicas": len(self.pods),
                           "readyReplicas": ready, "availableReplicas": ready,
                           "conditions": [self.conditions[k] for k in (AVAILABLE, PROGRESSING)
                                          if k in self.conditions]}}  # fmt: skip

    def pod_statuses(self) -> list[dict[str, Any]]:
        """The pods labelled `app: isvc.<name>` (ListPodsByLabel), the newest first as a list
        of the informer's cache may hold them."""
        return [p.status() for p in reversed(self.pods)]

    def delete(self) -> None:
        for pod in self.pods:
            pod.delete()

    def errors(self) -> list[BaseException]:
        return [p.error for p in self.pods if p.error]
