"""The test cluster's controllers: Trainer (TrainJob -> JobSet, status), JobSet and Job.

`Cluster` lists TrainJobs in one namespace of the test API server every POLL_S (an informer's
list, not a watch: the launcher's watch is what is under test). For each new one it reads
the ClusterTrainingRuntime, renders the JobSet (cluster/render.py) and runs it (`JobSetRun`):
one pod per node (cluster/kubelet.py); a failed pod is retried while the Job's backoffLimit
allows, a failed Job restarts the whole JobSet while failurePolicy.maxRestarts allows, and the
outcome is written to the TrainJob's status as the Trainer does. A JobSet that JobSet's webhook
refuses (cluster/jobset_webhook.py) makes no pods: the Trainer records a Warning Event
(cluster/events.py) on each retry and sets no condition. Deleting the TrainJob deletes its pods
(the garbage collector's part).
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from cluster.events import EventRecorder
from cluster.jobset_webhook import admission_error
from cluster.kubelet import Kubelet, Pod
from cluster.render import NODE, Rendered, render
from components.launcher import GROUP, PLURAL, VERSION

RUNTIMES = "clustertrainingruntimes"
# The Job controller's pace here: how often pods' exits are looked at.
POLL_S = 0.05

# kubernetes-sigs/jobset pkg/constants/constants.go: the JobSet's condition reasons and
# messages, which kubeflow/trainer pkg/runtime/framework/plugins/jobset/jobset.go (Status)
# copies onto the TrainJob as `Complete` / `Failed`.
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
# kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go (Reconcile): when the JobSet
# cannot be created, a Warning Event with this reason and no condition; the error requeues the
# TrainJob with controller-runtime's default per-item back-off (cmd/trainer-controller-manager/
# main.go passes empty controller.Options; client-go util/workqueue/default_rate_limiters.go:
# 5 ms doubling to 1000 s).
CREATION_FAILED = "TrainJobResourcesCreationFailed"
REQUEUE_BASE_S, REQUEUE_MAX_S = 0.005, 1000.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now}  # fmt: skip


class JobSetRun(threading.Thread):
    """One TrainJob's JobSet, from its first pods to the TrainJob's final condition."""

    def __init__(
        self, api: Any, kubelet: Kubelet, events: EventRecorder, trainjob: dict[str, Any]
    ):
        super().__init__(daemon=True, name=f"jobset-{trainjob['metadata']['name']}")
        self.api, self.kubelet, self.events, self.trainjob = api, kubelet, events, trainjob
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
            plan = render(self.trainjob, runtime)
            # JobSet's webhook refuses the JobSet Trainer would create (cluster/jobset_webhook.py).
            if refused := admission_error(plan.jobset):
                return self._retry_creation(refused)
            while True:
                failed_job = self._attempt(plan)
                if self.deleted.is_set():
                    return
                if failed_job is None:
                    return self._finish("Complete", *COMPLETED)
                # kubernetes-sigs/jobset pkg/controllers/failure_policy.go executeFailurePolicy:
                # no policy fails at once; the default rule restarts (recreates every Job) until
                # maxRestarts restarts were made; messageWithFirstFailedJob names the Job.
                reason, message = FAILED_JOBS if plan.max_restarts is None else MAX_RESTARTS
                if plan.max_restarts is None or self.restarts >= plan.max_restarts:
                    self._finish("Failed", reason, f"{message} (first failed job: {failed_job})")
                    # The failed Job's running pods are terminated (kept, with their logs).
                    for pod in self.current.values():
                        self.kubelet.stop(pod)
                    return
                for pod in self.pods:
                    if pod.attempt == self.restarts:
                        self.kubelet.delete(pod)
                self.restarts += 1
        except BaseException as e:  # noqa: BLE001  (surfaced by the test through Cluster.errors)
            self.error = e
            print(f"test cluster: TrainJob {meta['namespace']}/{meta['name']}: {e!r}")

    def _retry_creation(self, refused: str) -> None:
        """The JobSet is refused: record why, as an Event, on every requeue until deleted."""
        # trainjob_controller.go: the error cut to 950 characters (`%.950v`), " ..." when cut.
        message = f"TrainJob resources reconciliation failed: {refused:.950}"
        if len(refused) > 950:
            message += " ..."
        backoff = REQUEUE_BASE_S
        while True:
            self.events.eventf(self.trainjob, "Warning", CREATION_FAILED, "Reconciling", message)
            if self.deleted.wait(backoff):
                return
            backoff = min(backoff * 2, REQUEUE_MAX_S)

    def _attempt(self, plan: Rendered) -> str | None:
        """Run the JobSet's one Job (`<jobset>-node-0`) to its end; its name if it failed.

        kubernetes pkg/controller/job/job_controller.go: an Indexed Job of `num_nodes`
        completions; a failed pod is replaced while failures <= backoffLimit, past it the Job
        fails (BackoffLimitExceeded); the caller terminates its running pods.
        """
        port = _free_port()
        job = f"{plan.name}-{NODE}-0"
        for index in range(plan.num_nodes):
            self.pods.append(self.kubelet.start(plan, index, self.restarts, port))
        self._jobs_status(plan)
        failures, succeeded = 0, set()
        while len(succeeded) < plan.num_nodes:
            if self.deleted.is_set():
                return None
            for index, pod in self.current.items():
                code = pod.proc.poll()
                if index in succeeded or code is None:
                    continue
                if code == 0:
                    succeeded.add(index)
                    continue
                failures += 1
                if failures > plan.backoff_limit:
                    return job
                self.pods.append(self.kubelet.start(plan, index, self.restarts, port))
            time.sleep(POLL_S)
        return None

    def lose_node(self, index: int) -> Pod:
        """SIGKILL every process of node `index`'s current pod, as if its machine died."""
        pod = self.current[index]
        self.kubelet.kill(pod)
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

    def __init__(self, api: Any, namespace: str, kubelet: Kubelet):
        super().__init__(daemon=True, name=f"test-cluster-{namespace}")
        self.api, self.namespace, self.kubelet = api, namespace, kubelet
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
                    self.runs[name] = JobSetRun(self.api, self.kubelet, self.events, obj)
                    self.runs[name].start()
            for name, run in list(self.runs.items()):
                if name not in names and not run.deleted.is_set():
                    run.deleted.set()
                    threading.Thread(target=run.delete, daemon=True).start()

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
        """Stop watching and delete every pod still there."""
        self._stopping.set()
        for run in self.runs.values():
            run.delete()
        self.join(5)
