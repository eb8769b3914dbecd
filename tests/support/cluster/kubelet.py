"""The kubelet of the test cluster: a pod is a local process group running its container.

What a pod gets here, and how that stands in for a node:
- the container's `command` + `args` with its env (downward-API `fieldRef`s resolved), as PID 1
  of a PID namespace of its own (cluster/pid1.py, when root), run by the project's own Python
  (the image is looked up, not pulled: `python`, `python3` resolve to this virtualenv's through
  PATH);
- each PVC mount is a local folder: the mount path is rewritten to the folder in the command,
  args and env values (the container's view, `/gpt/...`, becomes `<folder>/...`). A program that
  builds the mount path from nothing would escape it; this project's stages get `--root /gpt`
  and their output paths from the runtime's command, so every path passes through the rewrite.
  A runtime that mounts the PVC elsewhere gets no rewrite, and its stage fails on `/gpt`;
- the network: pods share this machine's, so the cluster DNS name of node 0
  (PET_MASTER_ADDR) resolves to 127.0.0.1, and the JobSet's port (PET_MASTER_PORT, 29500 in
  every pod on a cluster) is mapped to a port of its own, held for the attempt
  (cluster/controller.py `_reserve_port`), so two TrainJobs (or two test sessions on one
  machine) never meet on 29500 and no other socket takes it before torchrun listens; a
  Service's `<name>.<namespace>.svc:<port>` in a URL of the env is where its server listens
  here (`services`, Trainer's status server);
- projected volumes (a service-account token from `token_issuer` for the projection's
  audience, ConfigMap items from `config_maps`): written once into the pod's folder and reached
  as a PVC mount is (the kubelet's rotation of the token at 80% of its life is not played);
- the log: stdout and stderr, line by line, into `<logs>/<namespace>/<pod>/node.log` (the
  container runtime's part, `ContainerLog`), rotated as the kubelet rotates it (`LogRotation`,
  `Kubelet._rotate`), `node.exit` holding the exit code once the container ended, the pod's
  labels beside them (components/trainjob/podlogs.py's `LogDirPodLogs` reads them), all moved to
  `<logs>/.deleted/` when the pod is deleted. The lines are kept raw, not in the CRI format
  (`<time> <stream> <P|F> <line>`), which the kubelet strips again when it serves `pods/log`;
- the pod's status: `status.json` beside them, a core/v1 PodStatus (phase, the PodScheduled
  condition, container `node`'s state), replaced whole as it changes (`_Status`), and its uid;
- images and machines: the registry is a set of image names (`images`; None: every image pulls,
  as where it is not modelled); a pod whose image is not there never starts (ErrImagePull, then
  ImagePullBackOff, `_ImagePull`). Every machine has `capacity`; a pod requesting more of a
  resource than that is unschedulable (`_unfit`).
- a built image (`run_images`, cluster/images.py): the container runs in the image's root
  filesystem (cluster/container.py), its command else the image's Entrypoint/Cmd, as the
  securityContext's user else the image's with fsGroup, the image's env under the spec's, the
  volumes bound at their mount paths (not rewritten), PID 1 of its own PID namespace; network
  and /dev stay this machine's. One the kubelet or the runtime refuses (runAsNonRoot as root, a
  user the image lacks, no command) never starts: it waits CreateContainerConfigError or
  CreateContainerError (`_refused`).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.trainjob.podlogs import STATUS_FILE, UID_FILE
from support.cluster.events import EventRecorder, write_whole
from support.cluster.images import (
    PID1,
    CreateContainerError,
    Image,
    container_command,
    set_volume_ownership,
)
from support.cluster.render import COMPLETION_INDEX, NODE, Rendered

if TYPE_CHECKING:  # cryptography is imported only where the TrainJobStatus gate is on
    from support.cluster.certs import TokenIssuer

# kubernetes staging/src/k8s.io/apimachinery/pkg/util/rand/rand.go: generateName's alphabet.
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
# kubernetes pkg/apis/core/v1/defaults.go: a pod's terminationGracePeriodSeconds defaults to 30.
DEFAULT_GRACE_S = 30
# kubernetes pkg/kubelet/kubelet.go: image pulls back off from backOffPeriod (10 s), doubling to
# MaxContainerBackOff (300 s) (flowcontrol.NewBackOff); kept short here, as the log monitor's
# interval is, so a test sees ErrImagePull turn into ImagePullBackOff within seconds.
IMAGE_BACKOFF_S, IMAGE_BACKOFF_MAX_S = 1.0, 30.0
# What every machine of the test cluster has: a node's worth of CPUs and memory (the runtimes
# request up to 2 CPUs and 4Gi), and no GPUs; how many machines the scheduler sees.
CAPACITY = {"cpu": "16", "memory": "64Gi"}
MACHINES = 2


def pod_name(jobset: str, index: int) -> str:
    """kubernetes-sigs/jobset pkg/util/placement/placement.go GenJobName `<jobset>-<rjob>-<i>`,
    then the Job controller's indexed pod name `<job>-<index>-<random>` (kubernetes
    pkg/controller/job/indexed_job_utils.go podGenerateNameWithIndex)."""
    suffix = "".join(secrets.choice(_SUFFIX) for _ in range(5))
    return f"{jobset}-{NODE}-0-{index}-{suffix}"


@dataclass(frozen=True)
class LogRotation:
    """The kubelet's container log rotation policy: kubernetes
    pkg/kubelet/apis/config/v1beta1/defaults.go (SetDefaults_KubeletConfiguration), applied by
    pkg/kubelet/logs/container_log_manager.go."""

    max_size: int = 10 * 1024 * 1024
    """containerLogMaxSize, default "10Mi": a running container's log this big is rotated."""
    max_files: int = 5
    """containerLogMaxFiles, default 5: the current file and the rotated ones together."""
    monitor_interval_s: float = 3.0
    """containerLogMonitorInterval: 10 s by default, here the least a kubelet accepts (3 s,
    below). At most one rotation per interval is what lets a follower of the log (the kubelet's
    own reader, which reopens the file after a rotation) miss nothing: were the file rotated
    twice before the reader reopened it, the file between would be skipped."""

    def __post_init__(self) -> None:
        # kubernetes pkg/kubelet/apis/config/validation/validation.go (v1.30+,
        # ValidateKubeletConfiguration; the field and this floor came with
        # kubernetes/kubernetes#114301, before which the interval was a fixed 10 s):
        # "containerLogMonitorInterval must be a positive time
        # duration greater than or equal to 3s"; pkg/kubelet/logs/container_log_manager.go
        # (NewContainerLogManager): "invalid MaxFiles %d, must be > 1".
        if self.monitor_interval_s < 3:
            raise ValueError(
                f"containerLogMonitorInterval {self.monitor_interval_s}s: a kubelet refuses "
                "less than 3s"
            )
        if self.max_files <= 1:
            raise ValueError(f"containerLogMaxFiles {self.max_files}: must be > 1")


class ContainerLog(threading.Thread):
    """The container runtime's side of the log (containerd's CRI logger): the container's stdout
    and stderr, one pipe, written line by line to `path`; `reopen` is CRI ReopenContainerLog, a
    new file at `path` after the kubelet renamed the old one. `node.exit` is written beside it
    once the container has ended and its output is all in the file, and then the pod's status
    (`status`, None for a pod whose container never started)."""

    # containerd's max_container_log_line_size: a longer line is written in parts.
    LINE_MAX = 16 * 1024

    def __init__(self, proc: subprocess.Popen, path: Path, status: _Status | None):
        super().__init__(daemon=True, name=f"log-{path.parent.name}")
        self.proc, self.path, self.status = proc, path, status
        self.lock = threading.Lock()
        self.file = open(path, "ab")  # noqa: SIM115  (open for the container's whole life)

    def run(self) -> None:
        for line in iter(lambda: self.proc.stdout.readline(self.LINE_MAX), b""):
            with self.lock:
                self.file.write(line)
                self.file.flush()
        with self.lock:
            self.file.close()
        code = exit_code(self.proc.wait())
        self.path.with_suffix(".exit").write_text(str(code))
        if self.status is not None:
            self.status.terminated(code)

    def reopen(self) -> None:
        with self.lock:
            if not self.file.closed:
                self.file.close()
                self.file = open(self.path, "ab")  # noqa: SIM115


@dataclass(frozen=True)
class Claim:
    """A bound PersistentVolumeClaim: the folder that is its volume, and its access modes."""

    folder: Path
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)


@dataclass
class Pod:
    name: str
    index: int
    attempt: int
    env: dict[str, str]
    """The container's env as a cluster would give it (DNS name, port 29500, /gpt paths)."""
    argv: list[str]
    """The command line as it runs here (mount paths rewritten)."""
    folder: Path
    proc: subprocess.Popen
    container_log: ContainerLog
    claims: tuple[str, ...] = ()
    """The claims it mounts (namespace/name)."""
    pending: str = ""
    """Why its container never started ("" when it runs the container's command)."""
    deleted: bool = False
    status: _Status | None = None
    """Its status.json."""
    image_pull: _ImagePull | None = None
    """The kubelet's pulls of an image the registry lacks."""
    grace_s: float = DEFAULT_GRACE_S
    """Its terminationGracePeriodSeconds."""
    pid_namespace: bool = False
    """Whether its container runs in a PID namespace of its own (cluster/pid1.py), as PID 1."""

    @property
    def exit_code(self) -> int | None:
        """Container `node`'s exit code as the runtime reports it, None while it runs."""
        code = self.proc.poll()
        return None if code is None else exit_code(code)

    @property
    def conditions(self) -> frozenset[str]:
        return frozenset(self.status.conditions) if self.status else frozenset()

    def first_process(self) -> int:
        """The host pid of the container's first process: PID 1 of its namespace (the child
        cluster/pid1.py forked), else the process the kubelet started."""
        if not self.pid_namespace:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        for _ in range(200):  # pid1.py forks at once; give it a moment under load
            with contextlib.suppress(FileNotFoundError):
                if pids := children.read_text().split():
                    return int(pids[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        return self.proc.pid

    @property
    def machine(self) -> str:
        """The node it runs on: node index i of a TrainJob on machine i (see `Kubelet`)."""
        return f"machine-{self.index}"

    @property
    def log(self) -> str:
        """The current log file (what `pods/log` returns), not the rotated ones."""
        return (self.folder / f"{NODE}.log").read_text(errors="replace")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Status:
    """A pod's status as `GET /api/v1/.../pods/<pod>` shows it (core/v1 PodStatus): `phase`,
    the `PodScheduled` condition (the others, Initialized, ContainersReady, Ready, are not
    modelled) and `containerStatuses` for container `node`, written whole to `status.json`.

    kubernetes pkg/scheduler/schedule_one.go (handleSchedulingFailure): an unschedulable pod
    gets PodScheduled False, reason Unschedulable, the FitError as message, and no container
    statuses. pkg/kubelet/kubelet_pods.go (convertToAPIContainerStatuses, getPhase): a
    container not yet started waits (`ContainerCreating`, or the reason and message of its last
    failed start); the pod is Pending until it runs, then Running, then Succeeded or Failed by
    the exit code (restartPolicy Never, as the runtimes set), the container `terminated` with
    reason Completed or Error.
    """

    def __init__(self, folder: Path, image: str) -> None:
        self.path, self.image = folder / STATUS_FILE, image
        self.lock = threading.Lock()
        self.started = ""
        self.conditions: dict[str, dict[str, Any]] = {}
        """Conditions set by others than the kubelet (DisruptionTarget), by type."""
        self._last: tuple[str, dict, dict | None] | None = None

    def condition(self, kind: str, reason: str, message: str) -> None:
        """Add a True condition of `kind` (kept in every later status)."""
        self.conditions[kind] = {"type": kind, "status": "True", "reason": reason,
                                 "message": message, "lastTransitionTime": _now()}  # fmt: skip
        if self._last is not None:
            self._write(*self._last)

    def unschedulable(self, message: str) -> None:
        self._write("Pending", {"status": "False", "reason": "Unschedulable", "message": message})

    def waiting(self, reason: str, message: str = "") -> None:
        said = {"reason": reason, **({"message": message} if message else {})}
        self._write("Pending", {"status": "True"}, {"waiting": said})

    def running(self) -> None:
        self.started = _now()
        self._write("Running", {"status": "True"}, {"running": {"startedAt": self.started}})

    def terminated(self, code: int) -> None:
        state = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                 "startedAt": self.started, "finishedAt": _now()}  # fmt: skip
        self._write("Succeeded" if code == 0 else "Failed", {"status": "True"},
                    {"terminated": state})  # fmt: skip

    def _write(self, phase: str, scheduled: dict, state: dict | None = None) -> None:
        self._last = (phase, scheduled, state)
        status: dict[str, Any] = {"phase": phase, "conditions": [
            {"type": "PodScheduled", "lastProbeTime": None, "lastTransitionTime": _now(),
             **scheduled}, *self.conditions.values()]}  # fmt: skip
        if state is not None:
            status["containerStatuses"] = [{
                "name": NODE, "image": self.image, "imageID": "", "ready": "running" in state,
                "restartCount": 0, "started": "running" in state, "state": state}]  # fmt: skip
        with self.lock:
            write_whole(self.path, json.dumps(status))


class _ImagePull(threading.Thread):
    """The kubelet's pulls of an image the registry lacks, until the pod is deleted.

    kubernetes pkg/kubelet/images/image_manager.go (EnsureImageExists, as in v1.30-v1.33): a
    failed pull records Warning `Failed` `Failed to pull image "<image>": <CRI error>` and
    starts the back-off, and the container waits with reason ErrImagePull (types.go) and the
    CRI's error; a sync within the back-off records Normal `BackOff` `Back-off pulling image
    "<image>"` and the container waits with reason ImagePullBackOff and that message.
    pkg/kubelet/kuberuntime/kuberuntime_container.go (startContainer) adds Warning `Failed`
    `Error: <reason>` each time. The CRI error is containerd's for a tag the registry does not
    have (internal/cri/server/images/image_pull.go, core/remotes/docker/resolver.go), as a gRPC
    NotFound status. The kubelet's core/v1 recorder keeps Events of one reason with other
    messages apart; the recorder here (tools/events) folds them into the first one's series.
    """

    def __init__(self, kubelet: Kubelet, pod_ref: dict[str, Any], status: _Status) -> None:
        super().__init__(daemon=True, name=f"image-pull-{pod_ref['metadata']['name']}")
        self.kubelet, self.pod_ref, self.status = kubelet, pod_ref, status
        self.stopped = threading.Event()

    def run(self) -> None:
        image, event = self.status.image, self.kubelet.recorder.eventf
        error = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                 f'failed to resolve reference "{image}": {image}: not found')
        backoff = IMAGE_BACKOFF_S
        while True:
            event(self.pod_ref, "Normal", "Pulling", "", f'Pulling image "{image}"')
            event(self.pod_ref, "Warning", "Failed", "", f'Failed to pull image "{image}": {error}')
            event(self.pod_ref, "Warning", "Failed", "", "Error: ErrImagePull")
            self.status.waiting("ErrImagePull", error)
            # The pod worker syncs again after a failed sync, within the back-off.
            if self.stopped.wait(backoff / 2):
                return
            message = f'Back-off pulling image "{image}"'
            event(self.pod_ref, "Normal", "BackOff", "", message)
            event(self.pod_ref, "Warning", "Failed", "", "Error: ImagePullBackOff")
            self.status.waiting("ImagePullBackOff", message)
            if self.stopped.wait(backoff / 2):
                return
            backoff = min(backoff * 2, IMAGE_BACKOFF_MAX_S)


class Kubelet:
    """Starts and deletes the pods of the test cluster's JobSets, and rotates their logs.

    Placement: node index i of a TrainJob runs on machine i, as the runtimes' requests make the
    scheduler spread them on a real cluster (a node's worth of CPUs or GPUs each), so a
    multi-node TrainJob mounts its claim from several machines: a ReadWriteOnce claim then
    attaches to the first only (`_attach_error`). A pod that waits (unschedulable, or for its
    volume) never starts later: its container's command never runs.
    """

    def __init__(
        self,
        logs: Path,
        claims: dict[tuple[str, str], Claim],
        node_env: dict[str, str],
        rotation: LogRotation = LogRotation(),
        images: Collection[str] | None = None,
        capacity: dict[str, str] = CAPACITY,
        run_images: Mapping[str, Image] | None = None,
    ):
        """`claims`: the bound PVCs by (namespace, name); `images`: those the registry has
        (None: any); `capacity`: each machine's resources (Quantity strings); `run_images`:
        built images by name, whose root filesystem a pod's container then runs in (as its
        user, PID 1 of its own PID namespace, its volumes bound: cluster/container.py), where
        the registry has only them; None: every container runs this machine's venv."""
        self.logs, self.node_env = logs, node_env
        self.run_images = run_images
        self.images = set(run_images) if run_images is not None else images
        self.capacity = capacity
        self.claims: dict[tuple[str, str], Claim] = {}
        # Who says why a pod waits: the scheduler (tools/events, as Trainer) and the
        # attach-detach controller (its older core/v1 recorder's count is not modelled).
        self.scheduler = EventRecorder(logs, "default-scheduler")
        self.attach_detach = EventRecorder(logs, "attachdetach-controller")
        # The kubelet's own (its core/v1 recorder's count is not modelled either).
        self.recorder = EventRecorder(logs, "kubelet")
        for (namespace, name), claim in claims.items():
            self.bind(namespace, name, claim)
        self.rotation = rotation
        self._pods: list[Pod] = []
        self._lock = threading.Lock()
        self._torn_down = threading.Event()
        self._rotator: threading.Thread | None = None
        self.services: dict[str, str] = {}
        """A Service's `<name>.<namespace>.svc:<port>` -> the `127.0.0.1:<port>` it is here."""
        self.token_issuer: TokenIssuer | None = None
        """What signs the service-account tokens of projected volumes (the API server's)."""
        self.config_maps: dict[tuple[str, str], dict[str, str]] = {}
        """ConfigMaps' data by (namespace, name)."""

    def bind(self, namespace: str, name: str, claim: Claim) -> None:
        """Make `claim` the PVC `name` of `namespace`, readable as a core/v1 PVC beside the
        pods (components/trainjob/claims.py's `LogDirClaims`)."""
        self.claims[(namespace, name)] = claim
        folder = self.logs / namespace / ".claims"
        folder.mkdir(parents=True, exist_ok=True)
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"accessModes": list(claim.access_modes)}}  # fmt: skip
        (folder / f"{name}.json").write_text(json.dumps(pvc))

    def _attach_error(self, namespace: str, claim: str, machine: str) -> str:
        """Why a ReadWriteOnce claim cannot be attached to `machine`, or "".

        kubernetes pkg/controller/volume/attachdetach/reconciler/reconciler.go: a volume that
        is not multi-attachable (ReadWriteMany/ReadOnlyMany) and is attached to another node
        with a pod there that uses it is not attached here; `reportMultiAttachError` records
        a FailedAttachVolume Warning on the waiting pod naming the pods that hold it. Ended
        pods hold nothing (their volumes are detached).
        """
        if {"ReadWriteMany", "ReadOnlyMany"} & set(self.claims[(namespace, claim)].access_modes):
            return ""
        key = f"{namespace}/{claim}"
        holders = sorted(p.name for p in self._pods
                         if key in p.claims and p.machine != machine and not p.pending
                         and not p.deleted and p.proc.poll() is None)  # fmt: skip
        if not holders:
            return ""
        return (f'Multi-Attach error for volume "{claim}" Volume is already used by pod(s) '
                f"{', '.join(holders)}")  # fmt: skip

    def _unfit(self, plan: Rendered) -> str:
        """The scheduler's message when no machine has what the pod requests, or "".

        kubernetes pkg/apis/core/v1/defaults.go (SetDefaults_Pod): a limit without a request
        is also the request (resourcesPerNode sets `limits` of nvidia.com/gpu).
        pkg/scheduler/framework/plugins/noderesources/fit.go (fitsRequest): a node whose
        allocatable is below a request fails with `Insufficient <resource>` (the requests of the
        pods already there are not counted here). pkg/scheduler/framework/types.go
        (FitError.Error): `0/<nodes> nodes are available: ` the reasons counted over the nodes,
        sorted, then the PostFilter's message, each ended with "."; the default preemption
        plugin finds no victim on a machine whose capacity is below the request.
        """
        resources = plan.container.get("resources") or {}
        requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        short = sorted(name for name, value in requests.items()
                       if _quantity(value) > _quantity(self.capacity.get(name, "0")))  # fmt: skip
        if not short:
            return ""
        reasons = ", ".join(f"{MACHINES} Insufficient {name}" for name in short)
        return (f"0/{MACHINES} nodes are available: {reasons}. preemption: 0/{MACHINES} nodes "
                f"are available: {MACHINES} No preemption victims found for incoming pod..")

    def _mounts(self, plan: Rendered) -> dict[str, Path] | str:
        """Mount path -> folder of each PVC mount, or why the pod cannot be scheduled.

        A claim is a namespaced object: a pod mounts the claim of that name in its own
        namespace. kubernetes pkg/scheduler/framework/plugins/volumebinding/volume_binding.go
        (PreFilter): a claim that does not exist there leaves the pod unschedulable,
        `persistentvolumeclaim "<name>" not found`, and Pending until it does.
        """
        volumes = {v["name"]: v for v in plan.pod_spec.get("volumes") or []}
        mounts = {}
        for mount in plan.container.get("volumeMounts") or []:
            claim = (volumes[mount["name"]].get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None:
                continue  # emptyDir (/dev/shm): this machine's own stands in
            if (plan.namespace, claim) not in self.claims:
                return f'0/1 nodes are available: persistentvolumeclaim "{claim}" not found.'
            mounts[mount["mountPath"]] = self.claims[(plan.namespace, claim)].folder
        return mounts

    def start(self, plan: Rendered, index: int, attempt: int, port: int) -> Pod:
        name = pod_name(plan.name, index)
        labels = {
            "jobset.sigs.k8s.io/jobset-name": plan.name,
            "jobset.sigs.k8s.io/replicatedjob-name": NODE,
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            COMPLETION_INDEX: str(index),
        }
        meta = {"name": name, "namespace": plan.namespace, "uid": str(uuid.uuid4()),
                "labels": labels, "annotations": {COMPLETION_INDEX: str(index)}}  # fmt: skip
        pod_ref = {"kind": "Pod", "apiVersion": "v1", "metadata": meta}
        env = {e["name"]: _env_value(e, meta) for e in plan.container["env"]}
        mounts = self._mounts(plan)
        claims = tuple(f"{plan.namespace}/{c}" for c in _claims(plan))
        folder = self.logs / plan.namespace / name
        folder.mkdir(parents=True)
        status = _Status(folder, plan.container.get("image", ""))
        pull: _ImagePull | None = None
        if pending := (mounts if isinstance(mounts, str) else "") or self._unfit(plan):
            self.scheduler.eventf(pod_ref, "Warning", "FailedScheduling", "Scheduling", pending)
            status.unschedulable(pending)
        else:
            with self._lock:
                pending = next(filter(None, (
                    self._attach_error(plan.namespace, c, f"machine-{index}")
                    for c in _claims(plan))), "")  # fmt: skip
            if pending:
                self.attach_detach.eventf(pod_ref, "Warning", "FailedAttachVolume", "Attaching",
                                          pending)  # fmt: skip
                status.waiting("ContainerCreating")
            elif self.images is not None and status.image not in self.images:
                pending = f"image {status.image} not in the registry"
                pull = _ImagePull(self, pod_ref, status)
                status.waiting("ContainerCreating")  # until its first pull fails
            elif refused := self._refused(plan, status.image, pod_ref):
                pending = refused.message
                status.waiting(refused.reason, refused.message)
            else:
                status.running()
        if not pending:
            mounts = {**mounts, **self._projected(plan, folder, meta)}
        image = None if pending or self.run_images is None else self.run_images[status.image]
        if pending:  # the container never starts: a process that waits stands in for the pod
            mounts, argv = {}, [sys.executable, "-c", "import signal; signal.pause()"]
        elif image is not None:  # paths stay as they are: the volumes are bound there
            argv = image.argv(plan.container)
        else:
            argv = [_remap(a, mounts) for a in plan.container.get("command", []) +
                    plan.container.get("args", [])]  # fmt: skip
        namespaced = not pending and (image is not None or pid_namespaces())
        local = {k: self._reach(v if image else _remap(v, mounts)) for k, v in env.items()}
        if "PET_MASTER_ADDR" in env:  # node 0's DNS name and the JobSet's port, as mapped here
            local.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
        local.update(
            # kubernetes pkg/kubelet/kubelet_pods.go: HOSTNAME is the pod's hostname
            # (JobSet sets it to <jobset>-<rjob>-<jobIndex>-<podIndex>).
            HOSTNAME=f"{plan.name}-{NODE}-0-{index}",
            **({} if image else {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}),
            **self.node_env,
        )
        (folder / UID_FILE).write_text(meta["uid"])
        write_whole(folder / "labels.json", json.dumps(labels))  # the step lists pods by it
        (folder / "pod.json").write_text(json.dumps({"env": env, "argv": argv}, indent=1))
        work = folder / "cwd"
        work.mkdir()
        if image is not None:
            argv = _in_image(image, plan, mounts, local, argv, folder)
        elif namespaced:
            argv = [sys.executable, str(PID1), *argv]
        proc = subprocess.Popen(
            argv, env=local, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            # A container with `stdin: true` has it open; nobody writes unless attached.
            stdin=subprocess.PIPE if plan.container.get("stdin") else subprocess.DEVNULL,
            start_new_session=True,  # the pod's processes are one group: one kill ends all
        )  # fmt: skip
        container_log = ContainerLog(proc, folder / f"{NODE}.log", None if pending else status)
        container_log.start()
        grace = plan.pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        pod = Pod(name, index, attempt, env, argv, folder, proc, container_log, claims, pending,
                  status=status, grace_s=grace, pid_namespace=namespaced)  # fmt: skip
        if pull is not None:
            pod.image_pull = pull
            pull.start()
        with self._lock:
            self._pods.append(pod)
            if self._rotator is None:
                self._rotator = threading.Thread(target=self._rotate, daemon=True,
                                                 name="kubelet-log-rotation")  # fmt: skip
                self._rotator.start()
        return pod

    def _projected(self, plan: Rendered, folder: Path, meta: dict[str, Any]) -> dict[str, Path]:
        """Mount path -> folder of each projected volume the container mounts, written now.

        kubernetes pkg/volume/projected/projected.go (collectData): a `serviceAccountToken`
        source is a TokenRequest for the pod with the projection's audience and
        expirationSeconds (default 3600), written at its `path`; a `configMap` source writes
        the listed keys at their paths (a ConfigMap not there is not modelled)."""
        volumes = {v["name"]: v for v in plan.pod_spec.get("volumes") or []}
        found = {}
        for mount in plan.container.get("volumeMounts") or []:
            projected = volumes[mount["name"]].get("projected")
            if projected is None:
                continue
            where = folder / "volumes" / mount["name"]
            where.mkdir(parents=True)
            for source in projected["sources"]:
                if token := source.get("serviceAccountToken"):
                    if self.token_issuer is None:
                        raise NotImplementedError("a token projection without a token issuer")
                    (where / token["path"]).write_text(self.token_issuer.issue(
                        token["audience"], token.get("expirationSeconds", 3600), plan.namespace,
                        meta))  # fmt: skip
                elif config_map := source.get("configMap"):
                    data = self.config_maps[(plan.namespace, config_map["name"])]
                    for item in config_map["items"]:
                        (where / item["path"]).write_text(data[item["key"]])
                else:
                    raise NotImplementedError(f"projected source {sorted(source)}")
            found[mount["mountPath"]] = where
        return found

    def _reach(self, text: str) -> str:
        """`text` with each Service's address in a URL replaced by where it listens here."""
        for service, address in self.services.items():
            text = text.replace(f"//{service}/", f"//{address}/")
        return text

    def _refused(self, plan: Rendered, image: str,
                 pod_ref: dict[str, Any]) -> CreateContainerError | None:  # fmt: skip
        """Why the kubelet or the runtime will not create the container from its built image
        (kubernetes v1.33 kuberuntime_container.go, startContainer: Warning `Failed` `Error:
        <message>`); None where they will, or where no built images run."""
        if self.run_images is None:
            return None
        try:
            self.run_images[image].identity(plan.pod_spec, plan.container)
            self.run_images[image].argv(plan.container)
        except CreateContainerError as e:
            self.recorder.eventf(pod_ref, "Warning", "Failed", "", f"Error: {e.message}")
            return e
        return None

    def _rotate(self) -> None:
        """kubernetes pkg/kubelet/logs/container_log_manager.go rotateLogs: every monitor
        interval, each running container whose log is at least containerLogMaxSize is rotated;
        a container that ended never is. Runs while any pod of this kubelet runs."""
        while True:
            time.sleep(self.rotation.monitor_interval_s)
            with self._lock:
                running = [p for p in self._pods if p.proc.poll() is None and not p.deleted]
                if not running:
                    self._rotator = None
                    return
                for pod in running:
                    _rotate_log(pod.container_log, self.rotation)

    def kill(self, pod: Pod, sig: int = signal.SIGKILL) -> None:
        """Signal every process of the pod (a lost node: SIGKILL)."""
        try:
            os.killpg(pod.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, pod: Pod) -> None:
        """Terminate the pod's container as a deletion does: SIGTERM to its first process
        alone, SIGKILL to all when the grace period ends.

        kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go (killContainer) asks the
        runtime to stop the container with the pod's grace period; containerd signals the
        container's init process only (the task's Kill without `all`), and SIGKILLs it once the
        timeout passes, which ends every process of its PID namespace. An init process that
        has no handler for SIGTERM does not get it at all (the kernel drops it: pid_namespaces(7),
        "signals sent to the init process"), so it waits out the grace period.
        """
        if pod.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pod.first_process(), signal.SIGTERM)
            end = time.monotonic() + pod.grace_s
            while pod.proc.poll() is None and time.monotonic() < end:
                if self._torn_down.wait(0.05):
                    break
            if pod.proc.poll() is None:
                self.kill(pod)
                pod.proc.wait()
        if pod.proc.stdin:
            pod.proc.stdin.close()

    def tear_down(self) -> None:
        """The test is over and the cluster goes with it: a pod in its termination grace, or
        stopped from now on, is killed at once (nothing is left to see what it does with the
        rest of its grace, which a pod that ignores SIGTERM would wait out whole)."""
        self._torn_down.set()

    def evict(self, pod: Pod) -> None:
        """Evict the pod, as `kubectl drain` does, and delete it: kubernetes
        pkg/registry/core/pod/storage/eviction.go adds the DisruptionTarget condition
        (EvictionByEvictionAPI) before the deletion, which a Job's podFailurePolicy reads."""
        if pod.status is not None:
            pod.status.condition("DisruptionTarget", "EvictionByEvictionAPI",
                                 "Eviction API: evicting")  # fmt: skip
        self.delete(pod)

    def status(self, pod: Pod) -> dict[str, Any]:
        """The pod's status.json, read under the lock that `delete` moves its folder under (a
        read between the move and `pod.folder`'s update would find no file)."""
        with self._lock:
            return json.loads((pod.folder / STATUS_FILE).read_text())

    def delete(self, pod: Pod) -> None:
        """Stop the pod and take it out of the namespace (its log kept under `.deleted/`)."""
        if pod.deleted:
            return
        if pod.image_pull is not None:
            pod.image_pull.stopped.set()
            pod.image_pull.join()
        self.stop(pod)
        pod.container_log.join(10)  # its output all in the file, node.exit written
        gone = self.logs / ".deleted" / pod.folder.parent.name
        gone.mkdir(parents=True, exist_ok=True)
        with self._lock:
            shutil.move(pod.folder, gone / pod.name)
            pod.folder, pod.deleted = gone / pod.name, True


def _rotate_log(log: ContainerLog, policy: LogRotation) -> None:
    """container_log_manager.go processContainer and rotateLog, step by step: reopen a missing
    log; below max size, nothing; else drop unused rotated files (`.tmp`, or already gzipped),
    remove the oldest beyond max_files - 2, gzip the rotated ones, rename the current file to
    `<log>.<YYYYmmdd-HHMMSS>` (rotateLatestLog) and reopen the container's log."""
    path = log.path
    try:
        if path.stat().st_size < policy.max_size:
            return
    except FileNotFoundError:
        log.reopen()
        return
    rotated = sorted(str(p) for p in path.parent.glob(f"{path.name}.*"))
    unused = [p for p in rotated if p.endswith(".tmp") or f"{p}.gz" in rotated]
    for p in unused:
        os.remove(p)
    inuse = [p for p in rotated if p not in unused]
    excess = max(0, len(inuse) - max(policy.max_files - 2, 0))
    for p in inuse[:excess]:  # oldest first, "so as not to break ongoing `kubectl logs`"
        os.remove(p)
    for p in inuse[excess:]:
        if not p.endswith(".gz"):
            with open(p, "rb") as src, gzip.open(f"{p}.tmp", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.rename(f"{p}.tmp", f"{p}.gz")
            os.remove(p)
    path.rename(f"{path}.{time.strftime('%Y%m%d-%H%M%S')}")
    log.reopen()


def exit_code(returncode: int) -> int:
    """A container's exit code as the runtime reports it: a process killed by signal N ends
    with 128 + N (containerd, as a shell reports it)."""
    return 128 - returncode if returncode < 0 else returncode


@functools.cache
def pid_namespaces() -> bool:
    """Whether containers can run in a PID namespace of their own here (cluster/pid1.py needs
    root); without one a container's first process is an ordinary process, which SIGTERM ends
    where a PID 1 would not even receive it."""
    if os.geteuid() != 0:
        return False
    probe = [sys.executable, str(PID1), "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _quantity(text: str | int | float) -> float:
    """A resource.Quantity's value (k8s.io/apimachinery pkg/api/resource/quantity.go: decimal
    and binary SI suffixes, `m` for thousandths)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    if not m:
        raise NotImplementedError(f"quantity {text!r}")
    scale = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return float(m.group(1)) * scale[m.group(2)]


def _env_value(var: dict[str, Any], meta: dict[str, Any]) -> str:
    """An EnvVar's value; `valueFrom.fieldRef` as the kubelet resolves the downward API
    (kubernetes pkg/kubelet/kubelet_pods.go podFieldSelectorRuntimeValue)."""
    if "valueFrom" not in var:
        return var.get("value", "")
    path = var["valueFrom"]["fieldRef"]["fieldPath"]
    if path in ("metadata.name", "metadata.namespace"):
        return meta[path.split(".")[1]]
    m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
    if not m:
        raise NotImplementedError(f"fieldRef {path}")
    return meta[m.group(1)].get(m.group(2), "")


def _remap(text: str, mounts: dict[str, Path]) -> str:
    """`text` with each mount path (a whole path component) replaced by its local folder."""
    for path, folder in mounts.items():
        text = re.sub(rf"(?<![\w./-]){re.escape(path)}(?![\w.-])", str(folder), text)
    return text


def _in_image(image: Image, plan: Rendered, mounts: dict[str, Path], env: dict[str, str],
              argv: list[str], folder: Path) -> list[str]:  # fmt: skip
    """The command running the pod's container in `image`: its volumes get the pod's fsGroup
    first; /tmp is the pod's own (a container's writable layer is its own, where here the
    image's pods share one root filesystem)."""
    pod_ctx = plan.pod_spec.get("securityContext") or {}
    if (fs_group := pod_ctx.get("fsGroup")) is not None:
        for volume in mounts.values():
            set_volume_ownership(volume, fs_group, pod_ctx.get("fsGroupChangePolicy"))
    tmp = folder / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    return container_command(image, folder / "container.json", argv, env,
                             {**mounts, "/tmp": tmp}, image.identity(plan.pod_spec, plan.container),
                             image.cwd(plan.container))  # fmt: skip


def _claims(plan: Rendered) -> list[str]:
    """The names of the PVCs the pod's container mounts."""
    volumes = {v["name"]: v for v in plan.pod_spec.get("volumes") or []}
    names = [(volumes[m["name"]].get("persistentVolumeClaim") or {}).get("claimName")
             for m in plan.container.get("volumeMounts") or []]  # fmt: skip
    return [n for n in names if n]
