"""How a person reaches the interactive prompt's pod: the attach command (or, for the chat page,
the port-forward command), printed as it appears."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.trainjob.podlogs import CONTAINER, JOBSET_LABEL, PodLogs, from_environment


def attach_hint(
    say: Callable[[str], None] = print,
    pods: PodLogs | None = None,
    web_port: int = 0,
) -> Callable[[dict[str, Any]], None]:
    """An `on_update` for an interactive TrainJob: tell the person how to attach, exactly (with
    `web_port`, how to reach the chat page: kubectl port-forward to the pod's localhost, where
    it listens, then a local browser).

    At once, a command that finds the pod by label; then, as soon as an update of the TrainJob
    (its jobsStatus changes when pods start) finds the pod, its name. No polling.
    """
    told: set[str] = set()
    source = pods or from_environment()

    def reach(namespace: str, pod: str) -> str:
        if web_port:
            return (f"kubectl -n {namespace} port-forward {pod} {web_port}:{web_port}\n"
                    f"  then open http://localhost:{web_port}/ in your browser")
        return f"kubectl -n {namespace} attach -it {pod} -c {CONTAINER}"

    def update(obj: dict[str, Any]) -> None:
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if "label" not in told:
            told.add("label")
            found_by_label = f"$(kubectl -n {namespace} get pod -l {JOBSET_LABEL}={name} -o name)"
            say(f"To talk to the model once its pod runs:\n  {reach(namespace, found_by_label)}")
        if "pod" not in told:
            found = source.pods(namespace, name)
            if found:
                told.add("pod")
                verb = "open its chat page with" if web_port else "attach with"
                say(f"Pod {found[0]} is up; {verb}:\n  {reach(namespace, found[0])}")

    return update
