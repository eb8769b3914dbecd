"""Node 0's log in the step's log while a TrainJob runs: what the KFP UI shows of a stage.

Trainer copies only `Complete` and `Failed` from the JobSet onto the TrainJob, so the TrainJob
says nothing between its creation and its end (up to a day of training). `LogFollower` follows
the log of node 0's pod, which prints the stage's progress (step, loss, tokens/s, ETA) and carries
its files, as it is written: each line a person reads is said at once (the base64 blocks are
hidden, components/trainjob/stagelog.py), and when node 0 becomes a new pod (a JobSet restart, label
`jobset.sigs.k8s.io/restart-attempt`, or the Job retrying a failed pod) one line says so and the
new pod is followed.

It also keeps the files node 0's newest pod carried, read whole from the followed stream: a
followed log goes on across the kubelet's rotations, while a plain read at the end returns only
the current file, which may begin inside a block; that read is the fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from components.trainjob.podlogs import PodLogs, PodRef
from components.trainjob.stagelog import CarriedFiles, files_from_log

# How often the pods are listed while node 0 has no pod to follow (before it starts, between
# restarts); a followed log needs no polling.
POLL_S = 0.5
# How long the end of a TrainJob waits for the followed stream to reach the end of the log (its
# container has ended by then, so the stream ends by itself).
DRAIN_S = 30.0


class LogFollower:
    """Follows node 0 of TrainJob `namespace/trainjob` from `start` to `finish`, in a thread."""

    def __init__(
        self, source: PodLogs, namespace: str, trainjob: str, say: Callable[[str], None]
    ) -> None:
        self.source, self.namespace, self.trainjob, self.say = source, namespace, trainjob, say
        self.shown = 0
        """Lines said so far."""
        self._files: dict[str, bytes] = {}
        self._told: set[str] = set()
        self._ending = threading.Event()
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"log-{trainjob}")

    def start(self) -> LogFollower:
        self._thread.start()
        return self

    def finish(self) -> None:
        """The TrainJob has ended: follow node 0's log to its end (at most DRAIN_S), then stop;
        at once after `stop`."""
        if self._abandoned:
            return
        self._ending.set()
        self._thread.join(DRAIN_S)
        self.stop()

    def stop(self) -> None:
        """Stop now: the TrainJob was deleted, and its pods may run out their termination grace
        (30 s by default) before their log ends; nothing they print then is the step's."""
        self._ending.set()
        self._abandoned = True  # a stream still open says nothing after the step moved on

    def files(self, log: str) -> dict[str, bytes]:
        """The files node 0 carried: those read whole from the followed stream, and from `log`
        (the final plain read) any the stream did not bring."""
        return {**files_from_log(log), **self._files}

    def _run(self) -> None:
        followed: PodRef | None = None
        while True:
            # Read before listing: once the TrainJob has ended, one more listing finds node 0's
            # last pod (whose log carries the files) even if it came and went unseen.
            ending = self._ending.is_set()
            pod = self._node0()
            if pod is not None and pod.name != (followed and followed.name):
                if followed is not None:
                    self.say(_replaced(followed, pod))
                followed = pod
                self._follow(pod)
                continue
            if ending:
                return
            self._ending.wait(POLL_S)

    def _node0(self) -> PodRef | None:
        try:
            return self.source.node0(self.namespace, self.trainjob)
        except Exception as e:  # noqa: BLE001  (progress is a courtesy: never fail the step)
            self._tell_once(f"(not following node 0's log: {e})")
            return None

    def _follow(self, pod: PodRef) -> None:
        """Say `pod`'s log as it comes, until its container ends (or the TrainJob did and the
        pod's log cannot be read)."""
        reader = CarriedFiles()
        self._files = reader.files  # the newest pod's files, filled as each block completes
        while True:
            ending, received = self._ending.is_set(), False
            try:
                for line in self.source.follow(self.namespace, pod.name):
                    if self._abandoned:
                        return
                    received = True
                    if (shown := reader.feed(line)) is not None:
                        self.say(shown)
                        self.shown += 1
                return
            except Exception as e:  # noqa: BLE001
                if received:  # a stream cut short: the rest comes from the plain read at the end
                    self.say(f"(the log stream of pod {pod.name} ended early: {e})")
                    return
                # Not started yet (a pending pod's log is refused) or already gone; once the
                # TrainJob has ended, one more try after the end was known.
                if ending:
                    self._tell_once(f"(could not follow the log of pod {pod.name}: {e})")
                    return
                self._ending.wait(POLL_S)

    def _tell_once(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            self.say(message)


def _replaced(old: PodRef, new: PodRef) -> str:
    if new.restart_attempt > old.restart_attempt:
        return (
            f"JobSet restart {new.restart_attempt}: pod {old.name} ended, node 0 is now pod "
            f"{new.name}; following its log"
        )
    return f"node 0's pod {old.name} was replaced by {new.name} (the Job retried it)"
