"""The shared TrainJob launcher: build a Kubeflow Trainer TrainJob, create it, follow it to its end.

Every stage on a cluster goes through `launch()`:
  1. build a TrainJob that sets only `spec.runtimeRef` and `spec.trainer` (image, command, args,
     env, numNodes, numProcPerNode, resourcesPerNode): the fields every Trainer v2.0-v2.3 has;
  2. create it under a fresh name (a retry or re-run never picks up an old TrainJob);
  3. follow it with a watch from the creation's resourceVersion, re-listing when the server says
     the version is gone (410) and resuming when a watch window ends; no sleeps;
  4. end on a condition: `Complete` returns, `Failed` raises with the condition's reason and
     message and the pod's log tail, and the deadline deletes the TrainJob and raises.

The stage's pod also prints the files the component turns into KFP artifacts (see `emit_script`),
because the component runs in `kubeflow` and cannot mount a PVC of `training`: its Role may read
pod logs there, so the log carries them back.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
# The JobSet the Trainer creates for a TrainJob has the TrainJob's name; its pods carry this label.
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
# The container every runtime of this project names (and the Trainer SDK expects).
CONTAINER = "node"
# Labels tying a TrainJob to the KFP run that made it: `kubectl get trainjobs -l pipeline/runid=ID`.
RUN_LABEL = "pipeline/runid"
STAGE_LABEL = "gpt-trainjobs/stage"
PART_OF = {"app.kubernetes.io/part-of": "gpt-trainjobs"}
LOG_TAIL_LINES = 40
# Longest single watch request; the server closes it and we resume from the last version seen.
WATCH_WINDOW_S = 300

_NAME_MAX = 63
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class TrainJobFailed(RuntimeError):
    """The TrainJob reached `Failed` (or vanished): the message holds why and the log tail."""


class TrainJobTimeout(TimeoutError):
    """The TrainJob did not finish before its deadline; it was deleted."""


# ---------------------------------------------------------------------------------------------
# Names and the spec


def trainjob_name(stage: str, run: str, suffix: str | None = None) -> str:
    """`<stage>-<run>-<random>`: an RFC-1035 label of at most 63 characters.

    The run part is cut to fit, the random suffix keeps two attempts of one run and stage apart.
    """
    suffix = suffix or secrets.token_hex(3)
    slug = re.sub(r"[^a-z0-9]+", "-", run.lower()).strip("-")
    head = re.sub(r"[^a-z0-9-]+", "-", stage.lower()).strip("-")
    if not head or not head[0].isalpha():
        raise ValueError(f"stage {stage!r}: must start with a letter")
    room = _NAME_MAX - len(head) - len(suffix) - 2
    slug = slug[:room].strip("-")
    return "-".join(part for part in (head, slug, suffix) if part)


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
    """ClusterTrainingRuntime to run against (`gpt-train`, ...)."""
    image: str
    command: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_nodes: int = 1
    num_proc_per_node: int = 1
    resources_per_node: dict[str, Any] | None = None
    """ResourceRequirements, e.g. `{"limits": {"nvidia.com/gpu": 1}}`; None: the runtime's."""


def build_trainjob(spec: TrainJobSpec, name: str, namespace: str, run: str) -> dict[str, Any]:
    """The TrainJob object, ready for `create_namespaced_custom_object`."""
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "args": list(spec.args),
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "numNodes": spec.num_nodes,
        "numProcPerNode": spec.num_proc_per_node,
    }
    if spec.resources_per_node:
        trainer["resourcesPerNode"] = spec.resources_per_node
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**PART_OF, STAGE_LABEL: spec.stage, RUN_LABEL: label_value(run)},
        },
        "spec": {"runtimeRef": {"name": spec.runtime}, "trainer": trainer},
    }


# ---------------------------------------------------------------------------------------------
# Files carried back through the pod log

_BEGIN = "==> gpt-trainjobs file {} <=="
_END = "<== gpt-trainjobs end <=="


def emit_script(rundir: str, files: Iterable[str]) -> str:
    """Shell that runs the stage (`"$@"`), then prints `files` of `rundir` base64-encoded.

    Only node 0 prints (PET_NODE_RANK is set by the Trainer's torch policy); a missing file is
    skipped, not an error, so a stage that legitimately writes nothing still succeeds.
    """
    lines = ['"$@" || exit $?', 'if [ "${PET_NODE_RANK:-0}" = 0 ]; then']
    for rel in files:
        path = shlex.quote(f"{rundir}/{rel}")
        lines.append(
            f"  if [ -f {path} ]; then echo {shlex.quote(_BEGIN.format(rel))}; "
            f"base64 {path}; echo {shlex.quote(_END)}; fi"
        )
    lines.append("fi")
    return "\n".join(lines)


def files_from_log(log: str) -> dict[str, bytes]:
    """The files `emit_script` printed into `log` (the last copy of each wins)."""
    found: dict[str, bytes] = {}
    current: str | None = None
    chunks: list[str] = []
    begin = re.compile(r"^==> gpt-trainjobs file (.+) <==$")
    for raw in log.splitlines():
        line = raw.strip()  # a TTY turns \n into \r\n
        m = begin.match(line)
        if m:
            current, chunks = m.group(1), []
        elif line == _END and current is not None:
            try:
                found[current] = base64.b64decode("".join(chunks), validate=True)
            except binascii.Error:
                pass  # a block cut by the log's size limit: report it as missing
            current = None
        elif current is not None:
            chunks.append(line)
    return found


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


LogReader = Callable[[str, str, int | None], str]
"""(namespace, trainjob name, tail lines or None for all) -> log text."""


def pods_of(namespace: str, trainjob: str) -> list[Any]:
    """The TrainJob's pods, node 0 first; empty where there is no core API to ask."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        pods = (
            client.CoreV1Api()
            .list_namespaced_pod(namespace, label_selector=f"{JOBSET_LABEL}={trainjob}")
            .items
        )
    except ApiException as e:
        if e.status in (403, 404):  # no pods permission or no core group (a CRD-only server)
            return []
        raise
    index = "batch.kubernetes.io/job-completion-index"
    return sorted(pods, key=lambda p: ((p.metadata.labels or {}).get(index, ""), p.metadata.name))


def read_pod_log(namespace: str, trainjob: str, tail_lines: int | None) -> str:
    """The log of the TrainJob's node-0 pod (the one that prints results), or why there is none."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    pods = pods_of(namespace, trainjob)
    if not pods:
        return f"(no pods found with label {JOBSET_LABEL}={trainjob})"
    name = pods[0].metadata.name
    try:
        return client.CoreV1Api().read_namespaced_pod_log(
            name, namespace, container=CONTAINER, tail_lines=tail_lines
        )
    except ApiException as e:
        return f"(log of pod {name} unavailable: {e.status} {e.reason})"


def attach_hint(
    namespace: str,
    say: Callable[[str], None] = print,
    find_pods: Callable[[str, str], list[Any]] = pods_of,
) -> Callable[[dict[str, Any]], None]:
    """An `on_update` for an interactive TrainJob: tell the person how to attach, exactly.

    At once, a command that finds the pod by label; then, as soon as an update of the TrainJob
    (its jobsStatus changes when pods start) finds the pod, its name. No polling.
    """
    told: set[str] = set()

    def update(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if "label" not in told:
            told.add("label")
            say(
                f"To talk to the model once its pod runs:\n  kubectl -n {namespace} attach -it "
                f"$(kubectl -n {namespace} get pod -l {JOBSET_LABEL}={name} -o name) -c {CONTAINER}"
            )
        if "pod" not in told:
            pods = find_pods(namespace, name)
            if pods:
                told.add("pod")
                say(
                    f"Pod {pods[0].metadata.name} is up; attach with:\n"
                    f"  kubectl -n {namespace} attach -it {pods[0].metadata.name} -c {CONTAINER}"
                )

    return update


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """status.conditions by type, only those that are True."""
    found = (obj.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if c.get("status") == "True"}


@dataclass
class Outcome:
    name: str
    namespace: str
    log: str
    """The node-0 pod's whole log (what the component reads artifacts from)."""
    elapsed_s: float


def launch(
    spec: TrainJobSpec,
    namespace: str,
    run: str,
    timeout_s: float,
    *,
    api: Any = None,
    log_reader: LogReader | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Create the TrainJob for `spec` and follow it to `Complete` (returns) or an error (raises).

    `api` is a `CustomObjectsApi` (default: from the kube config), `log_reader` reads the pod's
    log (default: `read_pod_log`); `on_update` sees every version of the TrainJob as it arrives
    (the prompt stage uses it to find its pod).
    """
    from kubernetes import client

    log_reader = log_reader or read_pod_log
    if timeout_s <= 0:
        raise ValueError(f"timeout: must be positive, got {timeout_s}")
    if api is None:
        load_kube_config()
        api = client.CustomObjectsApi()
    name = trainjob_name(spec.stage, run)
    body = build_trainjob(spec, name, namespace, run)
    start = time.monotonic()
    # 409 (the name exists) propagates: a fresh random name that collides is a surprise worth
    # stopping for, never a TrainJob to adopt.
    obj = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    say(
        f"created TrainJob {namespace}/{name} (runtime {spec.runtime}, {spec.num_nodes} node(s) x "
        f"{spec.num_proc_per_node} process(es)); follow it with: "
        f"kubectl -n {namespace} get trainjob {name} -w"
    )
    try:
        final = _follow(api, namespace, name, obj, start + timeout_s, on_update)
    except TrainJobTimeout:
        _delete(api, namespace, name)
        tail = log_reader(namespace, name, LOG_TAIL_LINES)
        raise TrainJobTimeout(
            f"TrainJob {namespace}/{name} did not finish within {timeout_s:g} s; deleted it. "
            f"Log tail:\n{tail}"
        ) from None
    elapsed = time.monotonic() - start
    done = conditions(final)
    if "Failed" in done:
        cond = done["Failed"]
        tail = log_reader(namespace, name, LOG_TAIL_LINES)
        raise TrainJobFailed(
            f"TrainJob {namespace}/{name} failed after {elapsed:.0f} s: "
            f"{cond.get('reason', '?')}: {cond.get('message', '')}\nLog tail:\n{tail}"
        )
    log = log_reader(namespace, name, None)
    say(f"TrainJob {namespace}/{name} complete after {elapsed:.0f} s. Log tail:")
    say("\n".join(_visible(log).splitlines()[-LOG_TAIL_LINES:]))
    return Outcome(name=name, namespace=namespace, log=log, elapsed_s=elapsed)


def _visible(log: str) -> str:
    """The log without the base64 blocks, which mean nothing to a reader."""
    out, inside = [], False
    for line in log.splitlines():
        s = line.strip()
        if s.startswith("==> gpt-trainjobs file "):
            inside = True
            out.append(f"[{s[4:-4]} carried back]")
        elif s == _END:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def _follow(
    api: Any,
    namespace: str,
    name: str,
    obj: dict[str, Any],
    deadline: float,
    on_update: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    """Watch the TrainJob from `obj`'s version until it is Complete or Failed; its last version."""
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    rv = obj["metadata"]["resourceVersion"]
    while True:
        if on_update:
            on_update(obj)
        if {"Complete", "Failed"} & conditions(obj).keys():
            return obj
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrainJobTimeout(name)
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
                if kind == "ERROR":  # a Status; 410 Gone arrives as ApiException, handled below
                    raise ApiException(status=new.get("code"), reason=new.get("message"))
                if kind == "DELETED":
                    raise TrainJobFailed(f"TrainJob {namespace}/{name} was deleted while running")
                rv = new["metadata"]["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    obj = new
                    break  # re-check conditions and deadline, then watch on from rv
            else:
                continue  # the window ended quietly: check the deadline, watch on
        except ApiException as e:
            if e.status != 410:
                raise
            # Our version was compacted away: re-read the object and watch on from now.
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            rv = obj["metadata"]["resourceVersion"]
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
