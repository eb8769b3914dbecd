"""train-gpt's progress in its TrainJob's status: rank 0 posts it to Kubeflow Trainer's status
server, so `kubectl get trainjob`, the Kubeflow SDK and the dashboard show it.

Kubeflow Trainer v2.3 with the `TrainJobStatus` feature gate gives every trainer container three
variables (kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go):
`KUBEFLOW_TRAINER_SERVER_URL`, the controller's status endpoint for this TrainJob,
`KUBEFLOW_TRAINER_SERVER_CA_CERT`, the CA its certificate is signed by, and
`KUBEFLOW_TRAINER_SERVER_TOKEN`, a projected service-account token with the TrainJob's own
audience, valid an hour, which the kubelet rotates: it is read again before every post. The
server (pkg/statusserver/server.go) takes a POST of an `UpdateTrainJobStatusRequest`
(pkg/apis/trainer/v1alpha1/trainjob_types.go) with that token as bearer and applies its
`trainerStatus` to the TrainJob, where the CRD holds it to its limits (a percentage of 0-100,
seconds >= 0, at most 256 metrics of a name and a string value of 1-64 characters each, and
`lastUpdatedTime`). Without the three variables nothing here runs.

Posting never holds training up: `report` hands the newest status to a thread of its own and
returns; the thread posts at most once every MIN_INTERVAL_S (a newer status replaces one not yet
posted), each request bounded by TIMEOUT_S. Only `finish` waits, for the 100% post at the end,
and at most FINISH_WAIT_S. A server that is down, slow or refusing costs one warning line, the
first time; the posts go on, each at its turn.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"

# At most one post every 5 s, as the Kubeflow SDK (`update_trainjob_status`) and transformers'
# KubeflowCallback keep to: the status server's own client to the API server allows 5 requests
# a second, burst 10, for every TrainJob of the cluster together (pkg/apis/config/v1alpha1/
# defaults.go, statusServer qps and burst), and waits for its turn when they are spent.
MIN_INTERVAL_S = 5.0
# One request's bound on connecting and on each read (the SDK's is 5 s too); the server's own
# read and write timeouts are 10 s.
TIMEOUT_S = 5.0
# What the end of training waits, at most, for its 100% to be posted.
FINISH_WAIT_S = 5.0
# The CRD's limits on trainerStatus: progressPercentage 0-100, estimatedRemainingSeconds an int32
# >= 0, metrics at most 256, each name and value 1-64 characters.
MAX_METRICS = 256
MAX_TEXT = 64
INT32_MAX = 2**31 - 1


class StatusRefused(Exception):
    """The status server answered, but not 200."""


def metric_value(value: float) -> str:
    """A metric as the CRD's string: six significant digits, a number of a million or more in
    whole units (tokens/s on a GPU), and never more than 64 characters."""
    if isinstance(value, int):
        text = str(value)
    else:
        text = f"{value:.0f}" if math.isfinite(value) and abs(value) >= 1e6 else f"{value:.6g}"
    return text if len(text) <= MAX_TEXT else f"{value:.6g}"


def status_request(percent: int, remaining_s: float | None, metrics: Mapping[str, float],
                   observed: datetime) -> dict[str, Any]:  # fmt: skip
    """The `UpdateTrainJobStatusRequest` the status server decodes: `percent` of the run done,
    the seconds left (None: not known yet), the metrics by name, when it was observed (RFC 3339,
    the server's metav1.Time)."""
    status: dict[str, Any] = {
        "progressPercentage": max(0, min(100, int(percent))),
        "lastUpdatedTime": observed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if remaining_s is not None and math.isfinite(remaining_s):
        status["estimatedRemainingSeconds"] = max(0, min(INT32_MAX, round(remaining_s)))
    items = [{"name": name, "value": metric_value(value)} for name, value in metrics.items()]
    if items:
        status["metrics"] = items[:MAX_METRICS]
    return {"trainerStatus": status}


@dataclass(frozen=True)
class StatusServer:
    """Where this TrainJob's status goes, as its three variables say."""

    url: str
    ca_cert: Path
    token: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StatusServer | None:
        """The server the variables name; None unless all three are set."""
        url, ca_cert, token = (env.get(k, "") for k in (ENV_URL, ENV_CA_CERT, ENV_TOKEN))
        if not (url and ca_cert and token):
            return None
        return cls(url, Path(ca_cert), Path(token))

    def post(self, request: dict[str, Any], timeout_s: float) -> None:
        """POST `request`: returns when the server took it, raises otherwise (OSError, an
        http.client error, StatusRefused). The token and the CA are read at each post: the
        kubelet rotates the one, Trainer's certificate rotator the other."""
        token = self.token.read_text().strip()
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        url = urlsplit(self.url)
        conn = http.client.HTTPSConnection(url.hostname or "", url.port or 443,
                                           timeout=timeout_s, context=context)  # fmt: skip
        try:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            conn.request("POST", url.path, json.dumps(request), headers)
            response = conn.getresponse()
            body = response.read(4096)
        finally:
            conn.close()
        if response.status != 200:
            raise StatusRefused(f"HTTP {response.status}: {_message(body)}")


def _message(body: bytes) -> str:
    """The message of the metav1.Status the server answers an error with, else the body."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


class StatusReporter:
    """Rank 0's reports of the run's progress, posted by a thread of its own."""

    def __init__(self, server: StatusServer, log: Callable[[str], None],
                 min_interval_s: float = MIN_INTERVAL_S,
                 timeout_s: float = TIMEOUT_S) -> None:  # fmt: skip
        self.server, self.log = server, log
        self.min_interval_s, self.timeout_s = min_interval_s, timeout_s
        self.metrics: dict[str, float] = {}
        """The newest value of each metric reported: a validation loss stays until the next."""
        self._pending: dict[str, Any] | None = None
        self._final = False
        self._wake = threading.Condition()
        self._finished = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._post_loop, daemon=True,
                                        name="trainjob-status")  # fmt: skip
        self._thread.start()

    @classmethod
    def from_env(cls, log: Callable[[str], None]) -> StatusReporter | None:
        """A reporter where Trainer gave this container a status server; else None."""
        server = StatusServer.from_env()
        return cls(server, log) if server else None

    def report(self, fraction: float, remaining_s: float | None,
               metrics: Mapping[str, float]) -> None:  # fmt: skip
        """The run is `fraction` done with `remaining_s` seconds to go (None: not known) and
        these newest metrics. Returns at once: the thread posts it when it may. Below 100%
        until `finish`: the export and the report still come after the last iteration."""
        self.metrics.update(metrics)
        percent = min(99, math.floor(fraction * 100 + 1e-9))  # 29/100 is 29%, not 28.999...
        self._hand_over(status_request(percent, remaining_s, self.metrics, datetime.now(UTC)),
                        final=False)  # fmt: skip

    def finish(self, metrics: Mapping[str, float] | None = None,
               wait_s: float = FINISH_WAIT_S) -> None:  # fmt: skip
        """The run is done: post 100% with these last metrics, waiting at most `wait_s`."""
        self.metrics.update(metrics or {})
        self._hand_over(status_request(100, 0, self.metrics, datetime.now(UTC)), final=True)
        self._finished.wait(wait_s)

    def _hand_over(self, request: dict[str, Any], final: bool) -> None:
        with self._wake:
            self._pending, self._final = request, final
            self._wake.notify()

    def _post_loop(self) -> None:
        last = -math.inf
        while True:
            with self._wake:
                # Wait for a status, then for its turn; the final one does not wait its turn.
                while self._pending is None or (
                    not self._final and time.monotonic() < last + self.min_interval_s
                ):
                    due = None if self._pending is None else last + self.min_interval_s
                    self._wake.wait(None if due is None else due - time.monotonic())
                request, final, self._pending = self._pending, self._final, None
            last = time.monotonic()
            self._post(request)
            if final:
                self._finished.set()
                return

    def _post(self, request: dict[str, Any]) -> None:
        try:
            self.server.post(request, self.timeout_s)
        except Exception as e:  # noqa: BLE001  (whatever it is, training goes on)
            if not self._warned:
                self._warned = True
                self.log(f"warning: the TrainJob's status server ({self.server.url}) did not take "
                         f"the progress: {type(e).__name__}: {e}; training goes on, and so do "
                         "the posts, without another line")  # fmt: skip
