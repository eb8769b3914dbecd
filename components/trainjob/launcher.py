"""The TrainJob launcher: create a Kubeflow Trainer TrainJob, follow it to its end, delete it.

Every stage on a cluster goes through `launch()`:
  1. build a TrainJob that sets only `spec.runtimeRef` and `spec.trainer` (image, command, args,
     env, numNodes, numProcPerNode, resourcesPerNode): the fields every Trainer v2.0-v2.3 has,
     and `spec.activeDeadlineSeconds` (v2.2+; older ones drop it);
  2. create it under a fresh name (a retry or re-run never picks up an old TrainJob);
  3. follow it with a watch from the creation's resourceVersion, re-listing when the server says
     the version is gone (410) and resuming when a watch window ends; no sleeps;
  4. end on a condition: `Complete` returns, `Failed` raises with the condition's reason and
     message and the pod's log tail, and the deadline deletes the TrainJob and raises.

What the stage's pod prints for the component to read back is
components/trainjob/stagelog.py's format;
the cluster objects are described in docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from components.trainjob.logfollow import LogFollower
from components.trainjob.placement import Placement
from components.trainjob.podlogs import PodLogs, PodRef, from_environment, node0_log
from components.trainjob.progress_lines import ProgressLines
from components.trainjob.stagelog import LOG_TAIL_LINES, tail
from components.trainjob.warning_events import Events
from components.trainjob.warning_events import from_environment as events_from_environment
from gpt.errors import first_line
from gpt.fetch.objectstore import ENV_OPTIONAL, ENV_REQUIRED

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
# Labels tying a TrainJob to the KFP run that made it: `kubectl get trainjobs -l pipeline/runid=ID`.
RUN_LABEL = "pipeline/runid"
STAGE_LABEL = "gpt-trainjobs/stage"
PART_OF = {"app.kubernetes.io/part-of": "gpt-trainjobs"}
# Longest single watch request; the server closes it and we resume from the last version seen.
WATCH_WINDOW_S = 300

# How long after the step's timeout the TrainJob's own activeDeadlineSeconds ends it.
DEADLINE_MARGIN_S = 60

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class TrainJobFailed(RuntimeError):
    """The TrainJob reached `Failed` (or vanished): the message holds why and the log tail."""


class TrainJobTimeout(TimeoutError):
    """The TrainJob did not finish before its deadline; it was deleted."""


class TrainJobStuck(RuntimeError):
    """The TrainJob did not start within `Placement.start_timeout` (no pods, or a pod left
    Pending); it was deleted. One line: which, and why."""


# ---------------------------------------------------------------------------------------------
# Names and the spec


# JobSet's webhook (kubernetes-sigs/jobset v0.12.0 pkg/webhooks/jobset_webhook.go) refuses a
# JobSet whose longest pod name, `<jobset>-<rjob>-<jobIndex>-<podIndex>-abcde`, is not a
# 63-character DNS-1035 label. Trainer v2.3 names the JobSet after the TrainJob, with the one
# replicatedJob `node` of one Job whose pods are numNodes, an int32 in the TrainJob CRD: so a
# TrainJob name of NAME_MAX characters is admitted for any node count.
NAME_MAX = 63 - len(f"-node-0-{2**31 - 2}-abcde")
NAME_RANDOM_HEX = 8
STAGE_MAX = NAME_MAX - 1 - NAME_RANDOM_HEX


def trainjob_name(stage: str) -> str:
    """`<stage>-<8 random hex>`: at most NAME_MAX characters, whatever the run is called.

    The run and stage are in the labels, as the Kubeflow SDK keeps its names short (PyPI
    `kubeflow` 0.5.0, kubeflow/trainer/backends/kubernetes/backend.py `train`: a letter and 11
    hex of a uuid4). Random, so a retry or re-run never picks up an old TrainJob; the stage
    leads, so that `kubectl get trainjobs` reads.
    """
    if not re.fullmatch(rf"[a-z][-a-z0-9]{{0,{STAGE_MAX - 1}}}", stage):
        raise ValueError(
            f"stage {stage!r}: at most {STAGE_MAX} characters of [a-z0-9-], starting a-z"
        )
    return f"{stage}-{secrets.token_hex(NAME_RANDOM_HEX // 2)}"


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value (63 characters of [A-Za-z0-9-_.], alphanumeric ends)."""
    value = re.sub(r"[^A-Za-z0-9-_.]+", "-", text)[:63].strip("-_.")
    assert _LABEL_VALUE.match(value), value
    return value


@dataclass(frozen=True)
class TrainJobSpec:
    """What a stage asks of its TrainJob. Only fields every Trainer v2.0-v2.3 accepts."""

    stage: str
    """Stage name, the first part of the TrainJob's name (`load-corpus`, `train-gpt`, ...)."""
    runtime: str
    """ClusterTrainingRuntime to run against (`gpt-train-gpt`, ...)."""
    image: str
    command: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    storage_secret: str = ""
    """A Secret in the TrainJob's namespace whose object-store and Hub keys
    (gpt/fetch/objectstore.py's ENV_REQUIRED, ENV_OPTIONAL) become the container's variables of
    the same names, by reference: no value enters the TrainJob. Empty: none."""
    placement: Placement = Placement()
    """Nodes, processes per node, GPUs, and the deadline `launch` keeps."""


def build_trainjob(spec: TrainJobSpec, name: str, namespace: str, run_id: str) -> dict[str, Any]:
    """The TrainJob object, ready for `create_namespaced_custom_object`."""
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "args": list(spec.args),
        "env": [{"name": k, "value": v} for k, v in spec.env.items()]
        + secret_env(spec.storage_secret, spec.args),
        "numNodes": spec.placement.num_nodes,
        "numProcPerNode": spec.placement.num_proc_per_node,
    }
    if spec.placement.resources_per_node:
        trainer["resourcesPerNode"] = spec.placement.resources_per_node
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**PART_OF, STAGE_LABEL: spec.stage, RUN_LABEL: label_value(run_id)},
        },
        "spec": {
            "runtimeRef": {"name": spec.runtime},
            "trainer": trainer,
            # The server's own backstop should this step die without deleting it: Trainer
            # v2.2+ fails the TrainJob (DeadlineExceeded) and deletes its JobSet past it. A
            # little after the step's own timeout, whose message says more. Trainer v2.0 and
            # v2.1 have no such field: their API server drops it (pruning unknown fields).
            "activeDeadlineSeconds": math.ceil(spec.placement.timeout) + DEADLINE_MARGIN_S,
        },
    }


def secret_env(secret: str, args: list[str]) -> list[dict[str, Any]]:
    """Env entries taking the object-store and Hub variables (HF_TOKEN and HF_ENDPOINT: for an
    hf:// source or --init_from) from the keys of the same names of `secret`. A TrainJob's
    `spec.trainer.env` is a list of core/v1 EnvVar, whose `valueFrom.secretKeyRef` the Trainer
    v2.3 CRD admits; it has no `envFrom` (trainer.kubeflow.org_trainjobs.yaml). A step whose
    `args` name an s3:// URI requires the two AWS keys: a missing Secret or key keeps the pod from
    starting (CreateContainerConfigError), which the launcher reports as a pod that does not
    start. Every other key, and the AWS keys of a step without s3://, are optional: set only
    where the Secret has them (a Secret holding only HF_TOKEN serves the Hub)."""
    if not secret:
        return []
    s3 = any(arg.startswith("s3://") for arg in args)
    required, optional = (ENV_REQUIRED, ENV_OPTIONAL) if s3 else ((), ENV_REQUIRED + ENV_OPTIONAL)
    return [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k, "optional": opt}}}
        for keys, opt in ((required, False), (optional, True))
        for k in keys
    ]


# ---------------------------------------------------------------------------------------------
# The cluster side


def load_kube_config() -> None:
    """In-cluster credentials in a pipeline step, else $KUBECONFIG / ~/.kube/config."""
    import os

    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        # Read $KUBECONFIG now: the client's default path was fixed when it was imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """status.conditions by type, only those that are True."""
    found = (obj.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if c.get("status") == "True"}


@dataclass
class Outcome:
    name: str
    namespace: str
    log: str
    """The node-0 pod's current log file, read once the TrainJob ended."""
    files: dict[str, bytes]
    """The files node 0 carried back (components/trainjob/stagelog.py), by their path in the run."""
    elapsed_s: float


def launch(
    spec: TrainJobSpec,
    namespace: str,
    run_id: str,
    *,
    api: Any = None,
    pods: PodLogs | None = None,
    events: Events | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Create the TrainJob for `spec` and follow it to `Complete` (returns) or an error (raises)
    within `spec.placement.timeout` seconds.

    `api` is a `CustomObjectsApi` (default: from the kube config), `pods` is where the pods'
    logs are read (default: `podlogs.from_environment()`), `events` where the TrainJob's
    Events are (default: `events.from_environment()`); `on_update` sees every version of the
    TrainJob as it arrives (the prompt stage uses it to find its pod), after its trainerStatus,
    where it changed, is said (components/trainjob/progress_lines.py). A TrainJob with no pod
    `spec.placement.start_timeout` seconds after its creation, or with a pod still Pending that
    long after the pod's creation, is deleted and raises `TrainJobStuck`.
    """
    from kubernetes import client

    pods = pods or from_environment()
    if api is None:
        load_kube_config()
        api = client.CustomObjectsApi()
    start = time.monotonic()
    obj = _create(api, spec, namespace, run_id, say)
    # The grace counts from the creation, not from the request: a create the API server's
    # admission (CEL rules, webhooks) holds for seconds must not spend the TrainJob's grace.
    created = time.monotonic()
    name = obj["metadata"]["name"]
    grace = spec.placement.start_timeout
    startup = _Startup(
        namespace, name, obj["metadata"]["uid"], pods, events or events_from_environment(),
        grace, created + grace,
    )
    job = _Created(api, namespace, name, pods, LogFollower(pods, namespace, name, say).start(), say)
    progress = ProgressLines(say)

    def seen(version: dict[str, Any]) -> None:
        progress(version)
        if on_update:
            on_update(version)

    final = job.follow(obj, start, spec.placement.timeout, seen, startup)
    return job.outcome(final, elapsed=time.monotonic() - start)


def _create(
    api: Any, spec: TrainJobSpec, namespace: str, run_id: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """Create the TrainJob for `spec` under a fresh name; the object the server returned."""
    name = trainjob_name(spec.stage)
    body = build_trainjob(spec, name, namespace, run_id)
    # 409 (the name exists) propagates: a fresh random name that collides is a surprise worth
    # stopping for, never a TrainJob to adopt.
    obj = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    say(
        f"created TrainJob {namespace}/{name} (runtime {spec.runtime}, "
        f"{spec.placement.num_nodes} node(s) x {spec.placement.num_proc_per_node} process(es)); "
        f"follow it with: kubectl -n {namespace} get trainjob {name} -w"
    )
    return obj


@dataclass
class _Created:
    """A TrainJob this step created and follows, with its pods' logs; how it ends decides
    whether it is deleted."""

    api: Any
    namespace: str
    name: str
    pods: PodLogs
    follower: LogFollower
    say: Callable[[str], None]

    def log_tail(self, lines: int | None) -> str:
        return node0_log(self.pods, self.namespace, self.name, lines)

    def delete(self) -> None:
        # The pods of a deleted TrainJob may run out their whole termination grace: nothing
        # they print meanwhile is the step's, so stop following them first.
        self.follower.stop()
        _delete(self.api, self.namespace, self.name)

    def follow(
        self,
        obj: dict[str, Any],
        start: float,
        timeout: float,
        on_update: Callable[[dict[str, Any]], None] | None,
        startup: _Startup,
    ) -> dict[str, Any]:
        """Its last version, once it ended. Deletes it and raises when it does not start, is
        not done `timeout` seconds after `start`, or this step stops following it."""
        where = f"{self.namespace}/{self.name}"
        try:
            with _sigterm_raises():
                return _follow(self.api, self.namespace, self.name, obj, start + timeout,
                               on_update, startup)  # fmt: skip
        except TrainJobStuck as e:
            self.delete()
            raise TrainJobStuck(f"{e}; deleted it") from None
        except TrainJobTimeout:
            last_lines = self.log_tail(LOG_TAIL_LINES)  # before the delete takes the pods' logs
            self.delete()
            raise TrainJobTimeout(
                f"TrainJob {where} did not finish within {timeout:g} s; deleted it. "
                f"Log tail:\n{last_lines}"
            ) from None
        except TrainJobFailed:
            raise  # it ended (or is gone) already: its pods and their logs stay for a look
        except BaseException as e:
            # SIGTERM (KFP's Terminate), Ctrl-C, an API error: nobody follows the TrainJob any
            # more, so nothing may keep running for it.
            self.delete()
            self.say(f"{_in_one_line(e)}: deleted TrainJob {where}")
            raise
        finally:
            self.follower.finish()  # returns at once where delete() stopped it

    def outcome(self, final: dict[str, Any], elapsed: float) -> Outcome:
        """What the ended TrainJob left: its log and files; raises TrainJobFailed if it failed."""
        where = f"{self.namespace}/{self.name}"
        if failed := conditions(final).get("Failed"):
            raise TrainJobFailed(
                f"TrainJob {where} failed after {elapsed:.0f} s: "
                f"{failed.get('reason', '?')}: {failed.get('message', '')}\n"
                f"Log tail:\n{self.log_tail(LOG_TAIL_LINES)}"
            )
        log = self.log_tail(None)
        self.say(f"TrainJob {where} complete after {elapsed:.0f} s.")
        if not self.follower.shown:  # the log was not followed: show its end now
            self.say(f"Log tail:\n{tail(log)}")
        return Outcome(name=self.name, namespace=self.namespace, log=log,
                       files=self.follower.files(log), elapsed_s=elapsed)  # fmt: skip


@dataclass
class _Startup:
    """Ends the wait for a TrainJob that does not start within `grace` seconds: one whose
    JobSet made no pod (counted from the TrainJob's creation, `deadline`), or one with a pod
    still Pending (counted from that pod's own creation, so the pods of a JobSet restart or a
    Job's retry get their own grace, never the first attempt's)."""

    namespace: str
    name: str
    uid: str
    pods: PodLogs
    events: Events
    grace: float
    deadline: float
    started: bool = False
    """The JobSet exists (Trainer's jobsStatus) or made a pod: the no-pod rule is over."""
    next_check: float = 0.0
    """When (time.monotonic) a pod may next be stuck, or a new pod may have appeared."""

    def check(self, obj: dict[str, Any]) -> None:
        """Note a start; raise TrainJobStuck for a TrainJob past its deadline without one, or
        for a pod Pending `grace` seconds after its creation."""
        pods = self.pods.refs(self.namespace, self.name)
        self.started = self.started or bool((obj.get("status") or {}).get("jobsStatus") or pods)
        now, mono = time.time(), time.monotonic()
        if not self.started:
            if mono >= self.deadline:
                self._stuck(f" made no pods within {self.grace:g} s", self._warning("TrainJob"))
            self.next_check = self.deadline
            return
        # The pod's creation is the API server's clock, `now` this step's: both keep UTC time.
        pending = [p for p in pods if p.phase == "Pending"]
        if stuck := next((p for p in pending if now - p.created >= self.grace), None):
            self._stuck(f"'s pod {stuck.name} is still Pending {self.grace:g} s after its creation",
                        self._why(stuck))  # fmt: skip
        # Look again when the oldest Pending pod's grace ends, else within a grace: a restart's
        # new pods appear without the TrainJob changing.
        self.next_check = mono + min((p.created + self.grace - now for p in pending),
                                     default=self.grace)  # fmt: skip

    def _why(self, pod: PodRef) -> str:
        """The reason its status gives with a message, else its newest Warning Event, else the
        TrainJob's, else its bare status reason."""
        if ": " in pod.waiting:
            return pod.waiting
        return (self._warning("Pod", pod.name, pod.uid) or self._warning("TrainJob")
                or pod.waiting or "no status or Warning Event says why")  # fmt: skip

    def _warning(self, kind: str, name: str = "", uid: str = "") -> str:
        """The newest Warning Event of the TrainJob (or of pod `name`), or ""."""
        found = self.events.warnings(self.namespace, kind, name or self.name, uid or self.uid)
        return str(found[-1]) if found else ""

    def _stuck(self, what: str, why: str) -> None:
        raise TrainJobStuck(" ".join(
            f"TrainJob {self.namespace}/{self.name}{what}: "
            f"{why or 'no Warning Event on it says why'}".split()
        ))  # fmt: skip

    def wake(self, remaining: float) -> float:
        """How long the next watch window may last: until the next check is due."""
        return max(0.05, min(remaining, self.next_check - time.monotonic() + 0.05))


def _in_one_line(e: BaseException) -> str:
    """An exception in one line: an API error by its status and reason, others by message."""
    from kubernetes.client.rest import ApiException

    if isinstance(e, ApiException):
        return f"API error {e.status} {e.reason}"
    return first_line(e)


class StepTerminated(Exception):
    """The step process got SIGTERM (KFP's Terminate stops a running step with it)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises StepTerminated (in the main thread only, where Python runs
    signal handlers; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise StepTerminated("SIGTERM: the step was terminated")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _finished(obj: dict[str, Any]) -> bool:
    return bool({"Complete", "Failed"} & conditions(obj).keys())


def _follow(
    api: Any,
    namespace: str,
    name: str,
    obj: dict[str, Any],
    deadline: float,
    on_update: Callable[[dict[str, Any]], None] | None,
    startup: _Startup,
) -> dict[str, Any]:
    """Watch the TrainJob from `obj`'s version until it is Complete or Failed; its last version.

    Each turn shows the current version to `on_update`, checks it, its start and the deadline,
    then waits for the next version in one watch window (ending at the start deadline while
    nothing has started).
    """
    from kubernetes.client.rest import ApiException

    rv = obj["metadata"]["resourceVersion"]
    while True:
        if on_update:
            on_update(obj)
        if _finished(obj):
            return obj
        startup.check(obj)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrainJobTimeout(name)
        try:
            obj, rv = _watch_window(api, namespace, name, obj, rv, startup.wake(remaining))
        except ApiException as e:
            if e.status != 410:
                raise
            # Our version was compacted away: re-read the object and watch on from now.
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            rv = obj["metadata"]["resourceVersion"]


def _watch_window(
    api: Any, namespace: str, name: str, obj: dict[str, Any], rv: str, remaining: float
) -> tuple[dict[str, Any], str]:
    """One watch request from version `rv`: the TrainJob's next version and its resourceVersion,
    or `obj` unchanged (with the last version a bookmark named) when the window ends quietly."""
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    w = watch.Watch()
    try:
        # The server ends the watch after timeout_seconds, which also bounds our deadline; a
        # window that ends quietly just starts the next one from the last version seen.
        for event in w.stream(
            api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=max(1, min(math.ceil(remaining), WATCH_WINDOW_S)),
            _request_timeout=min(remaining, WATCH_WINDOW_S) + 30,
        ):
            kind, new = event["type"], event["object"]
            if kind == "ERROR":  # a Status; 410 Gone arrives as ApiException, handled above
                raise ApiException(status=new.get("code"), reason=new.get("message"))
            if kind == "DELETED":
                raise TrainJobFailed(f"TrainJob {namespace}/{name} was deleted while running")
            rv = new["metadata"]["resourceVersion"]
            if kind in ("ADDED", "MODIFIED"):
                return new, rv
        return obj, rv
    finally:
        w.stop()


def _delete(api: Any, namespace: str, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        # Background: the TrainJob goes now, the garbage collector takes its JobSet and pods.
        api.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background"
        )
    except ApiException as e:
        if e.status != 404:
            raise
