"""Launcher: from a TrainJob's `Complete` condition to `launch()` returning (the watch latency).

Against the test API server of `../shared/k8s-apiserver` (a real apiextensions-apiserver with
the Trainer CRDs, no controllers). A thread plays the Trainer controller: it finds the TrainJob
the launcher created and patches its `status.conditions` to Complete; the clock runs from just
before that patch request to the moment `launch()` returns, so it includes the patch itself, the
watch event and the launcher's handling (no pod logs are read: there are no pods).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.harness import SHARED, Result, Stats, fmt_stats
from components.trainjob.launcher import TrainJobSpec, launch
from components.trainjob.placement import Placement
from components.trainjob.podlogs import LogDirPodLogs
from tests.support.apiserver import Controller, available, condition, namespace, running

REPEATS = 20
# An empty log folder: there are no pods to read (the launcher then says so in one line).
NO_PODS = LogDirPodLogs(Path("/nonexistent"))
SPEC = TrainJobSpec(stage="bench", runtime="gpt-train-gpt", image="gpt-workload:bench",
                    command=["python", "-m", "gpt", "train-gpt"], placement=Placement(timeout=60))


def latency_s(api) -> float:
    """One TrainJob, launched and completed, in a namespace of its own."""
    ns = namespace()
    done = condition("Complete", "JobsCompleted", "done")
    controller = Controller(api, ns, done, delay=0.05)
    launch(SPEC, ns, "bench", api=api, pods=NO_PODS, say=lambda _: None)
    returned = time.monotonic()
    controller.join()
    if controller.error:
        raise controller.error
    return returned - controller.patched_at


def run(quick: bool) -> Result:
    result = Result(
        "launcher",
        {"server": "../shared/k8s-apiserver (etcd + apiextensions-apiserver, Trainer v2.3.0 CRDs)",
         "repeats": REPEATS, "warmup": 1},
        ["what", "median", "min", "max", "runs"],
    )
    if reason := available(SHARED):
        result.rows.append({"what": f"skipped: {reason}"})
        return result
    from kubernetes import client

    with tempfile.TemporaryDirectory() as workdir, running(SHARED, Path(workdir)) as server:
        api = client.CustomObjectsApi(server.client())
        latency_s(api)  # warm-up: connections, the server's first watch
        ms = Stats([latency_s(api) * 1e3 for _ in range(REPEATS)])
    result.rows.append(
        {
            "what": "Complete -> launch() returns",
            "median": fmt_stats(ms, " ms"),
            "min": f"{min(ms.values):.1f} ms",
            "max": f"{max(ms.values):.1f} ms",
            "runs": len(ms.values),
            "latency_ms": ms.as_dict(),
        }
    )
    return result
