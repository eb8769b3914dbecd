"""Kubeflow Trainer v2.3's TrainJob status server, as the test cluster runs it with the
`TrainJobStatus` feature gate: the HTTPS endpoint a trainer pod POSTs its progress to, which
applies it to the TrainJob's `status.trainerStatus`.

Follows kubeflow/trainer v2.3.0 pkg/statusserver/: server.go (routes, the handler, its answers),
middleware.go (the 64 KiB body limit), auth.go (the bearer token), utils.go (the path and the
token's audience), setup.go and pkg/apis/config/v1alpha1/defaults.go (its own API client,
5 requests a second, burst 10); the request type is pkg/apis/trainer/v1alpha1/trainjob_types.go's
`UpdateTrainJobStatusRequest`, decoded as Go's encoding/json decodes it. What is applied goes
through the test API server, whose CRD schema and CEL rule judge it as a cluster's would.

Not modelled: Go's path cleaning (a redirect for `//` or `..`), HTTP/2, the server's 10 s read
and write timeouts beyond a socket timeout, and the OIDC provider's discovery (the issuer's key
is known here).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from support.cluster.certs import ServingCert, TokenIssuer
from support.cluster.render import status_host, status_path, token_audience

# kubeflow/trainer v2.3.0 pkg/apis/config/v1alpha1/defaults.go: statusServer's qps and burst.
QPS, BURST = 5.0, 10
# server.go: maxBodySize; its read timeout.
MAX_BODY = 1 << 16
READ_TIMEOUT_S = 10.0
# utils.go StatusUrl, as server.go routes it (`{namespace}` and `{name}` one segment each).
_PATH = re.compile(r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)"
                   r"/status")  # fmt: skip
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
INT32 = (-(2**31), 2**31 - 1)

Apply = Callable[[str, str, dict[str, Any]], None]
"""Applies a status (`{"trainerStatus": ...}`) to TrainJob (namespace, name); raises
`ApplyError` as the API server refuses it."""


class ApplyError(Exception):
    """The API server refused the apply: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class TokenBucket:
    """client-go's client-side rate limiter (flowcontrol.NewTokenBucketRateLimiter, over
    golang.org/x/time/rate): `qps` tokens a second, at most `burst` saved; `wait` takes one,
    waiting for it when none is left (a reservation: later callers queue behind)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps, self.burst = qps, burst
        self.tokens, self.last = float(burst), time.monotonic()
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.qps) - 1
            self.last = now
            delay = max(0.0, -self.tokens / self.qps)
        time.sleep(delay)


class PayloadError(ValueError):
    """What Go's json.Decoder would not decode into an UpdateTrainJobStatusRequest."""


class _Number(str):
    """A JSON number that is not an integer literal, kept as its text (Go parses an int32
    field's literal with strconv.ParseInt: `1e2` and `12.0` are type errors)."""


def _field(obj: dict[str, Any], name: str) -> Any:
    """encoding/json's key matching: the exact name, else any key equal under case folding;
    of duplicate keys the last wins."""
    if name in obj:
        return obj[name]
    found = [v for k, v in obj.items() if k.casefold() == name.casefold()]
    return found[-1] if found else None


def _int32(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not INT32[0] <= value <= INT32[1]:
        raise PayloadError(f"cannot unmarshal {value!r} into int32")
    return value


def _string(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or isinstance(value, _Number):
        raise PayloadError(f"cannot unmarshal {value!r} into string")
    return value


def _time(value: Any) -> str | None:
    """metav1.Time.UnmarshalJSON: null is the zero time; else a string time.Parse(RFC3339)
    takes. Returns it as metav1.Time marshals it (UTC, whole seconds), None for zero."""
    if value is None:
        return None
    if not isinstance(value, str) or isinstance(value, _Number) or not _RFC3339.fullmatch(value):
        raise PayloadError(f"cannot parse {value!r} as RFC 3339")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise PayloadError(str(e)) from None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode_request(body: bytes) -> dict[str, Any] | None:
    """The trainerStatus of an UpdateTrainJobStatusRequest as server.go's toApplyConfig makes
    it (None: no trainerStatus), or PayloadError. Go's json.Decoder reads the first JSON value
    and leaves the rest; unknown fields are ignored; null leaves a field unset."""
    decoder = json.JSONDecoder(parse_float=_Number, parse_constant=_Number)
    try:
        request, _ = decoder.raw_decode(body.decode().lstrip(" \t\r\n"))
    except (UnicodeDecodeError, ValueError) as e:
        raise PayloadError(str(e)) from None
    if request is None:
        return None
    if not isinstance(request, dict):
        raise PayloadError("cannot unmarshal into UpdateTrainJobStatusRequest")
    status = _field(request, "trainerStatus")
    if status is None:
        return None
    if not isinstance(status, dict):
        raise PayloadError("cannot unmarshal into TrainerStatus")
    applied: dict[str, Any] = {}
    for name in ("progressPercentage", "estimatedRemainingSeconds"):
        if (value := _int32(_field(status, name))) is not None:
            applied[name] = value
    metrics = _field(status, "metrics")
    if metrics is not None and not isinstance(metrics, list):
        raise PayloadError("cannot unmarshal into []Metric")
    items = []
    for metric in metrics or []:
        metric = {} if metric is None else metric
        if not isinstance(metric, dict):
            raise PayloadError("cannot unmarshal into Metric")
        items.append({"name": _string(_field(metric, "name")),
                      "value": _string(_field(metric, "value"))})  # fmt: skip
    if items:  # toApplyConfig: WithMetrics per item; none leaves the field out
        applied["metrics"] = items
    # toApplyConfig sets lastUpdatedTime always: the zero time marshals as null.
    applied["lastUpdatedTime"] = _time(_field(status, "lastUpdatedTime"))
    return applied


class StatusServer:
    """The status endpoint on 127.0.0.1 (`address`, where the kubelet maps the service's
    `status_host():STATUS_PORT`): `url(namespace, name)` is what a pod posts to, `cert.ca_pem`
    what it verifies the server by."""

    def __init__(self, issuer: TokenIssuer, apply: Apply) -> None:
        self.issuer, self.apply = issuer, apply
        self.cert = ServingCert.make(status_host())
        self.limiter = TokenBucket(QPS, BURST)
        self.requests: list[tuple[int, str]] = []
        """Every request's answer: (HTTP status, the path), in order."""
        with tempfile.TemporaryDirectory() as tmp:  # ssl loads a chain from files only
            chain, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            chain.write_bytes(self.cert.cert_pem)
            key.write_bytes(self.cert.key_pem)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(chain, key)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        # The handshake on the request's thread, not the one that accepts.
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True,
                                                do_handshake_on_connect=False)  # fmt: skip
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True,
                         name="trainer-status-server").start()  # fmt: skip

    def url(self, namespace: str, name: str) -> str:
        return f"https://{self.address}{status_path(namespace, name)}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def authorized(self, header: str, namespace: str, name: str) -> bool:
        """auth.go Authorize: exactly one RFC 7235 bearer credential (scheme in any case), a
        token the issuer verifies for the TrainJob's audience, bound to a pod of its namespace."""
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return False
        claims = self.issuer.verify(parts[1], token_audience(namespace, name))
        return bool(claims) and (claims.get("kubernetes.io") or {}).get("namespace") == namespace

    def handle(self, method: str, path: str, headers: Any, body: Callable[[], bytes]
               ) -> tuple[int, dict[str, Any]]:  # fmt: skip
        """server.go: the chain (body limit), the route, the handler; (status, JSON answer)."""
        length = headers.get("Content-Length")
        if length is not None and int(length) > MAX_BODY:
            return _failure(413, "Payload too large", "RequestEntityTooLarge")
        route = _PATH.fullmatch(path.split("?", 1)[0])
        if method != "POST" or route is None:
            return _failure(404, "Not found", "NotFound")
        namespace, name = route.groups()
        if not self.authorized(headers.get("Authorization") or "", namespace, name):
            return _failure(403, "Forbidden", "Forbidden")
        try:
            status = decode_request(body())
        except PayloadError:
            return _failure(422, "Invalid payload", "Invalid")
        if status is None:  # nothing to apply: the (empty) request echoed
            return 200, {}
        self.limiter.wait()  # the API client's turn (setup.go createClient)
        try:
            self.apply(namespace, name, {"trainerStatus": status})
        except ApplyError as e:
            if e.status in (400, 422):
                return _failure(422, e.message or "Validation failed", "Invalid")
            if e.status == 404:
                return _failure(404, "Train job not found", "NotFound")
            return _failure(500, "Internal error", "InternalError")
        echo = {k: v for k, v in status.items() if k != "metrics"}
        if "metrics" in status:  # Metric's fields are omitempty
            echo["metrics"] = [{k: v for k, v in m.items() if v} for m in status["metrics"]]
        return 200, {"trainerStatus": echo}


def _failure(code: int, message: str, reason: str) -> tuple[int, dict[str, Any]]:
    """server.go badRequest: a metav1.Status as encoding/json writes it (no kind/apiVersion)."""
    return code, {"metadata": {}, "status": "Failure", "message": message, "reason": reason,
                  "code": code}  # fmt: skip


def _handler(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            read = 0

            def body() -> bytes:  # MaxBytesReader: no more than the limit is read
                nonlocal read
                data = self.rfile.read(min(length, MAX_BODY + 1))
                read = len(data)
                return data

            code, answer = server.handle(self.command, self.path, self.headers, body)
            server.requests.append((code, self.path))
            data = (json.dumps(answer) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            # net/http's finishRequest: a body left unread is discarded, up to 256 KiB
            # (maxPostHandlerReadBytes), before the connection goes on; a bigger one closes it.
            # A socket closed on unread bytes would reset the client before it read the answer.
            if 0 < length - read <= 256 << 10:
                self.rfile.read(length - read)
            self.close_connection = length - read > 256 << 10

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the server's own request log is at verbosity 5

    return Handler


def api_apply(api: Any) -> Apply:
    """server.go: `Status().Apply` of the TrainJob with only status.trainerStatus, field manager
    `trainer-status`, force: a server-side apply through the test API server."""
    from kubernetes.client.rest import ApiException

    from components.trainjob.launcher import GROUP, PLURAL, VERSION

    def apply(namespace: str, name: str, status: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
                "metadata": {"name": name, "namespace": namespace}, "status": status}  # fmt: skip
        try:
            api.api_client.call_api(
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status",
                "PATCH", query_params=[("fieldManager", "trainer-status"), ("force", "true")],
                header_params={"Content-Type": "application/apply-patch+yaml",
                               "Accept": "application/json"},
                body=body, response_type="object", auth_settings=["BearerToken"],
                _return_http_data_only=True)  # fmt: skip
        except ApiException as e:
            try:
                message = json.loads(e.body)["message"]
            except (TypeError, ValueError, KeyError):
                message = str(e.reason)
            raise ApplyError(e.status, message) from None

    return apply


# Dead status servers: what train-gpt must outlive (tests/workload/training/test_trainer_status.py,
# bench/status_server.py).


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers; yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def refused_port() -> int:
    """A port nothing listens on: a connection there is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
