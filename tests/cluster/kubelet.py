"""The kubelet of the test cluster: a pod is a local process group running its container.

What a pod gets here, and how that stands in for a node:
- the container's `command` + `args` with its env (downward-API `fieldRef`s resolved), run by
  the project's own Python (the image is recorded, not pulled: `python`, `torchrun` resolve to
  this virtualenv's through PATH);
- each PVC mount is a local folder: the mount path is rewritten to the folder in the command,
  args and env values (the container's view, `/gpt/...`, becomes `<folder>/...`). A program that
  builds the mount path from nothing would escape it; this project's stages get `--root /gpt`
  and their output paths from the runtime's command, so every path passes through the rewrite.
  A runtime that mounts the PVC elsewhere gets no rewrite, and its stage fails on `/gpt`;
- the network: pods share this machine's, so the cluster DNS name of node 0
  (PET_MASTER_ADDR) resolves to 127.0.0.1, and the JobSet's port (PET_MASTER_PORT, 29500 in
  every pod on a cluster) is mapped to a free port of its own, so two TrainJobs (or two test
  sessions on one machine) never meet on 29500;
- the log: stdout and stderr, line by line, into `<logs>/<namespace>/<pod>/node.log` (the
  container runtime's part, `ContainerLog`), rotated as the kubelet rotates it (`LogRotation`,
  `Kubelet._rotate`), `node.exit` holding the exit code once the container ended, the pod's
  labels beside them (components/podlogs.py's `LogDirPodLogs` reads them), all moved to
  `<logs>/.deleted/` when the pod is deleted. The lines are kept raw, not in the CRI format
  (`<time> <stream> <P|F> <line>`), which the kubelet strips again when it serves `pods/log`.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.events import EventRecorder
from cluster.render import COMPLETION_INDEX, NODE, Rendered

# kubernetes staging/src/k8s.io/apimachinery/pkg/util/rand/rand.go: generateName's alphabet.
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"
# Seconds between SIGTERM and SIGKILL when a pod is deleted (a pod's default is 30; kept short).
GRACE_S = 3


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
    monitor_interval_s: float = 0.2
    """containerLogMonitorInterval is 10 s by default; checking more often here rotates sooner,
    never later, so a reader of the log meets at least what a cluster does, in test time."""


class ContainerLog(threading.Thread):
    """The container runtime's side of the log (containerd's CRI logger): the container's stdout
    and stderr, one pipe, written line by line to `path`; `reopen` is CRI ReopenContainerLog, a
    new file at `path` after the kubelet renamed the old one. `node.exit` is written beside it
    once the container has ended and its output is all in the file."""

    # containerd's max_container_log_line_size: a longer line is written in parts.
    LINE_MAX = 16 * 1024

    def __init__(self, proc: subprocess.Popen, path: Path):
        super().__init__(daemon=True, name=f"log-{path.parent.name}")
        self.proc, self.path = proc, path
        self.lock = threading.Lock()
        self.file = open(path, "ab")  # noqa: SIM115  (open for the container's whole life)

    def run(self) -> None:
        for line in iter(lambda: self.proc.stdout.readline(self.LINE_MAX), b""):
            with self.lock:
                self.file.write(line)
                self.file.flush()
        with self.lock:
            self.file.close()
        self.path.with_suffix(".exit").write_text(str(self.proc.wait()))

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

    @property
    def machine(self) -> str:
        """The node it runs on: node index i of a TrainJob on machine i (see `Kubelet`)."""
        return f"machine-{self.index}"

    @property
    def log(self) -> str:
        """The current log file (what `pods/log` returns), not the rotated ones."""
        return (self.folder / f"{NODE}.log").read_text(errors="replace")


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
    ):
        """`claims`: the bound PVCs by (namespace, name)."""
        self.logs, self.node_env = logs, node_env
        self.claims: dict[tuple[str, str], Claim] = {}
        # Who says why a pod waits: the scheduler (tools/events, as Trainer) and the
        # attach-detach controller (its older core/v1 recorder's count is not modelled).
        self.scheduler = EventRecorder(logs, "default-scheduler")
        self.attach_detach = EventRecorder(logs, "attachdetach-controller")
        for (namespace, name), claim in claims.items():
            self.bind(namespace, name, claim)
        self.rotation = rotation
        self._pods: list[Pod] = []
        self._lock = threading.Lock()
        self._rotator: threading.Thread | None = None

    def bind(self, namespace: str, name: str, claim: Claim) -> None:
        """Make `claim` the PVC `name` of `namespace`, readable as a core/v1 PVC beside the
        pods (components/claims.py's `LogDirClaims`)."""
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
        meta = {"name": name, "namespace": plan.namespace, "labels": labels,
                "annotations": {COMPLETION_INDEX: str(index)}}  # fmt: skip
        env = {e["name"]: _env_value(e, meta) for e in plan.container["env"]}
        mounts = self._mounts(plan)
        claims = tuple(f"{plan.namespace}/{c}" for c in _claims(plan))
        pending = ""
        if isinstance(mounts, str):  # unschedulable
            pending, recorder, reason, action = mounts, self.scheduler, "FailedScheduling", \
                "Scheduling"  # fmt: skip
        else:
            with self._lock:
                pending = next(filter(None, (
                    self._attach_error(plan.namespace, c, f"machine-{index}")
                    for c in _claims(plan))), "")  # fmt: skip
            recorder, reason, action = self.attach_detach, "FailedAttachVolume", "Attaching"
        if pending:  # the container never starts: a process that waits stands in for the pod
            pod_ref = {"kind": "Pod", "apiVersion": "v1", "metadata": meta}
            recorder.eventf(pod_ref, "Warning", reason, action, pending)
            mounts, argv = {}, [sys.executable, "-c", "import signal; signal.pause()"]
        else:
            argv = [_remap(a, mounts) for a in plan.container.get("command", []) +
                    plan.container.get("args", [])]  # fmt: skip
        local = {k: _remap(v, mounts) for k, v in env.items()}
        if "PET_MASTER_ADDR" in env:  # node 0's DNS name and the JobSet's port, as mapped here
            local.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
        local.update(
            # kubernetes pkg/kubelet/kubelet_pods.go: HOSTNAME is the pod's hostname
            # (JobSet sets it to <jobset>-<rjob>-<jobIndex>-<podIndex>).
            HOSTNAME=f"{plan.name}-{NODE}-0-{index}",
            PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
            **self.node_env,
        )
        folder = self.logs / plan.namespace / name
        folder.mkdir(parents=True)
        (folder / "labels.json").write_text(json.dumps(labels))
        (folder / "pod.json").write_text(json.dumps({"env": env, "argv": argv}, indent=1))
        work = folder / "cwd"
        work.mkdir()
        proc = subprocess.Popen(
            argv, env=local, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            # A container with `stdin: true` has it open; nobody writes unless attached.
            stdin=subprocess.PIPE if plan.container.get("stdin") else subprocess.DEVNULL,
            start_new_session=True,  # the pod's processes are one group: one kill ends all
        )  # fmt: skip
        container_log = ContainerLog(proc, folder / f"{NODE}.log")
        container_log.start()
        pod = Pod(name, index, attempt, env, argv, folder, proc, container_log, claims, pending)
        with self._lock:
            self._pods.append(pod)
            if self._rotator is None:
                self._rotator = threading.Thread(target=self._rotate, daemon=True,
                                                 name="kubelet-log-rotation")  # fmt: skip
                self._rotator.start()
        return pod

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
        """Terminate the pod's processes as a deletion does: SIGTERM, then SIGKILL after grace."""
        if pod.proc.poll() is None:
            self.kill(pod, signal.SIGTERM)
            try:
                pod.proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill(pod)
                pod.proc.wait()
        if pod.proc.stdin:
            pod.proc.stdin.close()

    def delete(self, pod: Pod) -> None:
        """Stop the pod and take it out of the namespace (its log kept under `.deleted/`)."""
        if pod.deleted:
            return
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


def _claims(plan: Rendered) -> list[str]:
    """The names of the PVCs the pod's container mounts."""
    volumes = {v["name"]: v for v in plan.pod_spec.get("volumes") or []}
    names = [(volumes[m["name"]].get("persistentVolumeClaim") or {}).get("claimName")
             for m in plan.container.get("volumeMounts") or []]  # fmt: skip
    return [n for n in names if n]
