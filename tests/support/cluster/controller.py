"""The test cluster's controllers: Trainer (TrainJob -> JobSet, status), JobSet and Job.

`Cluster` lists TrainJobs in one namespace of the test API server every POLL_S (an informer's
list, not a watch: the launcher's watch is what is under test). For each new one it reads
the ClusterTrainingRuntime, renders the JobSet (cluster/render.py) and runs it (`JobSetRun`):
one pod per node (cluster/kubelet.py); a failed pod is retried while the Job's backoffLimit
allows, a failed Job restarts the whole JobSet while failurePolicy.maxRestarts allows, and the
outcome is written to the TrainJob's status as the Trainer does. A JobSet that JobSet's webhook
refuses (cluster/jobset_webhook.py) makes no pods: the Trainer records a Warning Event
(cluster/events.py) on each retry and sets no condition. Deleting the TrainJob deletes its pods
(the garbage collector's part). With the `TrainJobStatus` feature gate on, the Trainer also
runs its status server (cluster/statusserver.py), and each TrainJob's pods get its variables
and credentials (cluster/render.py) and the ConfigMap of its CA.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from components.trainjob.launcher import GROUP, PLURAL, VERSION
from support.cluster.events import EventRecorder
from support.cluster.failure import (
    BACKOFF_LIMIT_EXCEEDED,
    POD_FAILURE_POLICY,
    PodFailure,
    jobset_verdict,
    match_pod_failure_policy,
)
from support.cluster.jobset_webhook import admission_error
from support.cluster.kubelet import Kubelet, Pod
from support.cluster.render import (
    NODE,
    STATUS_PORT,
    TRAINJOB_STATUS,
    Rendered,
    render,
    status_host,
    tls_config_map,
)

if TYPE_CHECKING:
    from support.cluster.statusserver import StatusServer

RUNTIMES = "clustertrainingruntimes"
# How often the controllers here look at the pods (an informer's events, upstream).
POLL_S = 0.05
# kubernetes pkg/controller/job/job_controller.go: `syncJobBatchPeriod`, the delay between a
# pod's update and the Job's sync, which sees every update that came meanwhile.
SYNC_BATCH_S = 1.0

# kubernetes-sigs/jobset pkg/constants/constants.go: the JobSet's condition reasons and
# messages (the failures' in cluster/failure.py), which kubeflow/trainer
# pkg/runtime/framework/plugins/jobset/jobset.go (Status) copies onto the TrainJob as
# `Complete` / `Failed`.
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
# kubeflow/trainer v2.3.0 pkg/constants/constants.go, pkg/apis/trainer/v1alpha1/trainjob_types.go:
# the Failed condition past spec.activeDeadlineSeconds.
DEADLINE = ("DeadlineExceeded", "TrainJob exceeded its active deadline")
DEADLINE_EXCEEDED = "deadline"
# kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go (Reconcile): when the JobSet
# cannot be created, a Warning Event with this reason and no condition; the error requeues the
# TrainJob with controller-runtime's default per-item back-off (cmd/trainer-controller-manager/
# main.go passes empty controller.Options; client-go util/workqueue/default_rate_limiters.go:
# 5 ms doubling to 1000 s).
CREATION_FAILED = "TrainJobResourcesCreationFailed"
REQUEUE_BASE_S, REQUEUE_MAX_S = 0.005, 1000.0


def _reserve_port() -> socket.socket:
    """A port of this machine kept for one JobSet attempt's rendezvous: node 0's torchrun
    listens on it as it would on PET_MASTER_PORT in a pod of its own network namespace, where
    nothing else can hold the port.

    Here every pod shares this machine's ports, so a port found free and then let go is any
    process's to take before node 0's torchrun binds it (seconds later: PyTorch's import), and
    was taken under a busy suite: the first attempt after a lost node then failed to listen
    (EADDRINUSE), its other node got SIGTERM in the rendezvous with an empty log, and the
    JobSet restarted once more. The socket holds the port (bound, never listening) until the
    attempt ends: Linux gives neither a bind to port 0 nor a connect's local port one that a
    socket is bound to, and SO_REUSEADDR, which torchrun's TCPStore sets too, lets the store
    listen there all the same."""
    reserved = socket.socket()
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.bind(("0.0.0.0", 0))
    return reserved


def _condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now}  # fmt: skip


class JobSetRun(threading.Thread):
    """One TrainJob's JobSet, from its first pods to the TrainJob's final condition."""

    def __init__(
        self, api: Any, kubelet: Kubelet, events: EventRecorder, trainjob: dict[str, Any],
        feature_gates: frozenset[str] = frozenset(), status_ca: str = "",
    ):
        super().__init__(daemon=True, name=f"jobset-{trainjob['metadata']['name']}")
        self.api, self.kubelet, self.events, self.trainjob = api, kubelet, events, trainjob
        self.feature_gates = feature_gates
        self.status_ca = status_ca
        """The status server's CA (PEM), where the TrainJobStatus gate is on."""
        self.created = time.monotonic()
        """When the Trainer first saw it: its creationTimestamp, within a poll."""
        self.pods: list[Pod] = []
        """Every pod it started, all attempts, in order."""
        self.restarts = 0
        self.deleted = threading.Event()
        self.error: BaseException | None = None

    @property
    def current(self) -> dict[int, Pod]:
        """The newest pod of each node index in the current attempt."""
        return {p.index: p for p in self.pods if p.attempt == self.restarts}

    def run(self) -> None:
        try:
            meta = self.trainjob["metadata"]
            runtime = self.api.get_cluster_custom_object(
                GROUP, VERSION, RUNTIMES, self.trainjob["spec"]["runtimeRef"]["name"]
            )
            plan = render(self.trainjob, runtime, self.feature_gates)
            if TRAINJOB_STATUS in self.feature_gates:
                # trainjobstatus.go (Build): the CA from the webhook's Secret, in a ConfigMap of
                # the TrainJob's namespace that its pods project.
                self.kubelet.config_maps[(meta["namespace"], tls_config_map(meta["name"]))] = {
                    "ca.crt": self.status_ca}  # fmt: skip
            # JobSet's webhook refuses the JobSet Trainer would create (cluster/jobset_webhook.py).
            if refused := admission_error(plan.jobset):
                return self._retry_creation(refused)
            counted = 0
            while True:
                with _reserve_port() as reserved:
                    failure = self._attempt(plan, reserved.getsockname()[1])
                if self.deleted.is_set():
                    return
                if failure is None:
                    return self._finish("Complete", *COMPLETED)
                if failure == DEADLINE_EXCEEDED:
                    return self._deadline_exceeded()
                job_reason, job = failure
                verdict, how, message = jobset_verdict(plan.failure_policy, job_reason, counted,
                                                       job)  # fmt: skip
                if verdict == "Failed":
                    return self._finish("Failed", how, message)
                # A restart recreates every Job: the old pods are deleted first.
                for pod in self.pods:
                    if pod.attempt == self.restarts:
                        self.kubelet.delete(pod)
                self.restarts += 1
                counted += how == "counted"
        except BaseException as e:  # noqa: BLE001  (surfaced by the test through Cluster.errors)
            self.error = e
            print(f"test cluster: TrainJob {meta['namespace']}/{meta['name']}: {e!r}")

    def _retry_creation(self, refused: str) -> None:
        """The JobSet is refused: record why, as an Event, on every requeue until deleted or
        past the TrainJob's activeDeadlineSeconds (the deadline is reconciled all the same)."""
        # trainjob_controller.go: the error cut to 950 characters (`%.950v`), " ..." when cut.
        message = f"TrainJob resources reconciliation failed: {refused:.950}"
        if len(refused) > 950:
            message += " ..."
        backoff = REQUEUE_BASE_S
        while True:
            self.events.eventf(self.trainjob, "Warning", CREATION_FAILED, "Reconciling", message)
            if self._past_deadline():
                return self._deadline_exceeded()
            if self.deleted.wait(min(backoff, self._until_deadline())):
                return
            backoff = min(backoff * 2, REQUEUE_MAX_S)

    def _until_deadline(self) -> float:
        seconds = self.trainjob["spec"].get("activeDeadlineSeconds")
        if not seconds:
            return math.inf
        return max(0.0, self.created + seconds - time.monotonic())

    def _past_deadline(self) -> bool:
        return self._until_deadline() == 0

    def _deadline_exceeded(self) -> None:
        """kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go (reconcileDeadline):
        past spec.activeDeadlineSeconds from the TrainJob's creation, the TrainJob gets Failed
        (DeadlineExceeded) and its JobSet is deleted, which deletes the pods."""
        self._finish("Failed", *DEADLINE)
        for pod in self.pods:
            self.kubelet.delete(pod)

    def _attempt(self, plan: Rendered, port: int) -> tuple[str, str] | str | None:
        """Run the JobSet's one Job (`<jobset>-node-0`), node 0's rendezvous on `port`, to its
        end: None when it completed, (the Job's failure reason, its name) when it failed,
        DEADLINE_EXCEEDED.

        kubernetes pkg/controller/job/job_controller.go (read at commit 6ae037f1db84): an
        Indexed Job of `num_nodes` completions. A pod's end queues a sync SYNC_BATCH_S later
        (`syncJobBatchPeriod`), which sees every pod that ended meanwhile. syncJob judges them
        all first: a FailJob rule of the podFailurePolicy (cluster/failure.py) fails the Job
        (PodFailurePolicy); failures it does not Ignore count, and past backoffLimit fail it
        (BackoffLimitExceeded). A failed Job's active pods are deleted (deleteActivePods) and
        no pod is created; otherwise `manageJob` replaces each failed pod.
        """
        job = f"{plan.name}-{NODE}-0"
        for index in range(plan.num_nodes):
            self.pods.append(self.kubelet.start(plan, index, self.restarts, port))
        self._jobs_status(plan)
        counted, succeeded = 0, set()
        while len(succeeded) < plan.num_nodes:
            if self.deleted.is_set():
                return None
            if self._past_deadline():
                return DEADLINE_EXCEEDED
            if not self._ended(succeeded):
                time.sleep(POLL_S)
                continue
            time.sleep(SYNC_BATCH_S)
            failed = []
            for index, pod in self._ended(succeeded).items():
                if pod.exit_code == 0:
                    succeeded.add(index)
                    continue
                what = PodFailure(plan.namespace, pod.name, pod.exit_code, pod.conditions)
                action, _ = match_pod_failure_policy(plan.pod_failure_rules, what)
                if action == "FailJob":
                    return self._fail_job(POD_FAILURE_POLICY, job)
                counted += action != "Ignore"
                failed.append(index)
            if counted > plan.backoff_limit:
                return self._fail_job(BACKOFF_LIMIT_EXCEEDED[0], job)
            for index in failed:
                self.pods.append(self.kubelet.start(plan, index, self.restarts, port))
        return None

    def _ended(self, succeeded: set[int]) -> dict[int, Pod]:
        """The current pods that have ended and are not yet counted as succeeded."""
        return {index: pod for index, pod in self.current.items()
                if index not in succeeded and pod.exit_code is not None}  # fmt: skip

    def _fail_job(self, reason: str, job: str) -> tuple[str, str]:
        """The Job failed: its pods still running are deleted (deleteActivePods)."""
        for pod in self.current.values():
            if pod.exit_code is None:
                self.kubelet.delete(pod)
        return reason, job

    def lose_node(self, index: int) -> Pod:
        """SIGKILL every process of node `index`'s current pod, as if its machine died."""
        pod = self.current[index]
        self.kubelet.kill(pod)
        return pod

    def evict(self, index: int) -> Pod:
        """Evict node `index`'s current pod (a drain, a preemption): SIGTERM, its grace
        period, DisruptionTarget (cluster/kubelet.py `evict`). Returns once it has ended."""
        pod = self.current[index]
        self.kubelet.evict(pod)
        return pod

    def _jobs_status(self, plan: Rendered) -> None:
        """status.jobsStatus as Trainer copies it from the JobSet (jobset.go Status): the
        prompt stage's attach hint looks for its pod when this changes."""
        status = {"name": NODE, "active": plan.num_nodes, "ready": plan.num_nodes,
                  "succeeded": 0, "failed": 0, "suspended": 0}  # fmt: skip
        self._patch_status({"jobsStatus": [status]})

    def _finish(self, kind: str, reason: str, message: str) -> None:
        self._patch_status({"conditions": [_condition(kind, reason, message)]})

    def _patch_status(self, status: dict[str, Any]) -> None:
        meta = self.trainjob["metadata"]
        self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"status": status}
        )

    def delete(self) -> None:
        """The TrainJob is gone: the garbage collector deletes the JobSet and its pods."""
        self.deleted.set()
        self.join()
        for pod in self.pods:
            self.kubelet.delete(pod)


class Cluster(threading.Thread):
    """Plays Trainer, JobSet, the Job controller and the kubelet for one namespace."""

    def __init__(self, api: Any, namespace: str, kubelet: Kubelet,
                 feature_gates: frozenset[str] = frozenset()):  # fmt: skip
        super().__init__(daemon=True, name=f"test-cluster-{namespace}")
        self.api, self.namespace, self.kubelet = api, namespace, kubelet
        self.feature_gates = feature_gates
        """The Trainer's feature gates that are on (v2.3.0 ships with none)."""
        self.status_server: StatusServer | None = None
        if TRAINJOB_STATUS in feature_gates:
            # cmd/trainer-controller-manager/main.go: the gate starts the status server; the
            # API server issues the pods' tokens that it verifies. (Imported here: cryptography
            # only where the gate is on.)
            from support.cluster.certs import TokenIssuer
            from support.cluster.statusserver import StatusServer, api_apply

            issuer = TokenIssuer()
            self.status_server = StatusServer(issuer, api_apply(api))
            kubelet.token_issuer = issuer
            kubelet.services[f"{status_host()}:{STATUS_PORT}"] = self.status_server.address
        self.runs: dict[str, JobSetRun] = {}
        # kubeflow/trainer v2.3.0 pkg/controller/setup.go: the TrainJob reconciler's recorder.
        self.events = EventRecorder(kubelet.logs, "trainer-trainjob-controller")
        self._stopping = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._stopping.wait(POLL_S):
            items = self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL
            )["items"]
            names = {obj["metadata"]["name"] for obj in items}
            for obj in items:
                name = obj["metadata"]["name"]
                if name not in self.runs:
                    run = JobSetRun(self.api, self.kubelet, self.events, obj, self.feature_gates,
                                    self._status_ca())  # fmt: skip
                    run.start()  # before it is seen: shutdown joins every run in self.runs
                    self.runs[name] = run
            for name, run in list(self.runs.items()):
                if name not in names and not run.deleted.is_set():
                    run.deleted.set()
                    threading.Thread(target=run.delete, daemon=True).start()

    def _status_ca(self) -> str:
        return self.status_server.cert.ca_pem.decode() if self.status_server else ""

    def wait_for(self, trainjob_prefix: str, timeout: float = 60) -> JobSetRun:
        """The JobSet of the first TrainJob whose name starts with `trainjob_prefix`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, run in list(self.runs.items()):
                if name.startswith(trainjob_prefix):
                    return run
            time.sleep(POLL_S)
        raise TimeoutError(f"no TrainJob {trainjob_prefix}* in {self.namespace}")

    def errors(self) -> list[BaseException]:
        return [r.error for r in self.runs.values() if r.error]

    def shutdown(self) -> None:
        """Stop watching and delete every pod still there, without their grace."""
        self.kubelet.tear_down()
        self._stopping.set()
        self.join(5)  # no run added while they are deleted
        for run in list(self.runs.values()):
            run.delete()
        if self.status_server:
            self.status_server.stop()
