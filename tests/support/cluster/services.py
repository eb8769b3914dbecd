"""The test cluster's Service and Ingress addresses as a client in the cluster reaches them: an
HTTP proxy (`http_proxy` for the code under test) that sends a request for
`http://<service>.<namespace>.svc.cluster.local/...` (port 80, the Service's) to the local port
the Service's ready pod listens on here, as cluster DNS and kube-proxy would.

Where a cluster would fail the connection, the proxy answers instead: 502 for a host that is no
Service here (DNS has no such name), 503 for a Service without a ready pod (no endpoint: the
connection is refused), each with a body that says so. Responses stream through unbuffered
(`Connection: close`, the body as the server sends it).
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SERVICE_PORT = 80  # the Service's port: KServe's CommonDefaultHttpPort
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te",
              "trailers", "transfer-encoding", "upgrade"}  # fmt: skip


class ServiceProxy(ThreadingHTTPServer):
    """`resolve(host)` -> the local port of that host's ready pod, None when it has none, or
    raise KeyError where no Service has that name."""

    daemon_threads = True

    def __init__(self, resolve: Callable[[str], int | None]):
        super().__init__(("127.0.0.1", 0), _Forward)
        self.resolve = resolve
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="service-proxy")  # fmt: skip
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Forward(BaseHTTPRequestHandler):
    server: ServiceProxy

    def log_message(self, *_) -> None:  # quiet: the servers log their own requests
        pass

    def _refuse(self, code: int, why: str) -> None:
        body = f"test cluster: {why}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _forward(self) -> None:
        url = urlsplit(self.path)
        host, port = url.hostname or "", url.port or SERVICE_PORT
        try:
            local = self.server.resolve(host) if port == SERVICE_PORT else None
        except KeyError:
            return self._refuse(502, f"no Service {host} (cluster DNS has no such name)")
        if local is None:
            return self._refuse(503, f"{host}:{port}: no ready endpoint (connection refused)")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection("127.0.0.1", local, timeout=300)
        path = url.path + (f"?{url.query}" if url.query else "")
        try:
            upstream.request(self.command, path or "/", body=body, headers=headers)
            response = upstream.getresponse()
        except OSError as e:  # the pod went away between the lookup and the request
            upstream.close()
            return self._refuse(503, f"{host}: {e}")
        with contextlib.closing(upstream):
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := response.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward
