"""A TrainJob's `status.trainerStatus` in the step's log: the progress its trainer posted to
Kubeflow Trainer's status server (gpt/training/trainer_status.py), as `kubectl get trainjob -o
yaml` shows it, one line each time it changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def describe(obj: dict[str, Any]) -> str:
    """The TrainJob's trainerStatus in one line, "" while it has none. Its lastUpdatedTime is
    left out: a post that changes nothing else is not news."""
    status = (obj.get("status") or {}).get("trainerStatus")
    if not status:
        return ""
    said = []
    if (percent := status.get("progressPercentage")) is not None:
        said.append(f"{percent}% done")
    if (left := status.get("estimatedRemainingSeconds")) is not None:
        said.append(f"about {left} s left")
    line = f"TrainJob {obj['metadata']['name']} trainerStatus: {', '.join(said) or 'no progress'}"
    metrics = status.get("metrics") or []
    if metrics:
        line += " | " + ", ".join(f"{m.get('name')} {m.get('value')}" for m in metrics)
    return line


class ProgressLines:
    """An `on_update` for `launcher.launch`: says `describe(obj)` when it differs from the last."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.last = say, ""

    def __call__(self, obj: dict[str, Any]) -> None:
        line = describe(obj)
        if line and line != self.last:
            self.last = line
            self.say(line)
