"""How a person reaches the interactive prompt's pod: the attach command, printed as it appears."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.trainjob.podlogs import CONTAINER, JOBSET_LABEL, PodLogs, from_environment


def attach_hint(
    say: Callable[[str], None] = print,
    pods: PodLogs | None = None,
) -> Callable[[dict[str, Any]], None]:
    """An `on_update` for an interactive TrainJob: tell the person how to attach, exactly.

    At once, a command that finds the pod by label; then, as soon as an update of the TrainJob
    (its jobsStatus changes when pods start) finds the pod, its name. No polling.
    """
    told: set[str] = set()
    source = pods or from_environment()

    def update(obj: dict[str, Any]) -> None:
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if "label" not in told:
            told.add("label")
            say(
                f"To talk to the model once its pod runs:\n  kubectl -n {namespace} attach -it "
                f"$(kubectl -n {namespace} get pod -l {JOBSET_LABEL}={name} -o name) -c {CONTAINER}"
            )
        if "pod" not in told:
            found = source.pods(namespace, name)
            if found:
                told.add("pod")
                say(
                    f"Pod {found[0]} is up; attach with:\n"
                    f"  kubectl -n {namespace} attach -it {found[0]} -c {CONTAINER}"
                )

    return update
