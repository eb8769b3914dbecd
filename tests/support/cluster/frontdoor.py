"""RBAC for the test API server, which authorizes every request of its admin certificate: a TLS
proxy in front of it (serving the API server's own certificate, so a copy of its kube config
pointing here is trusted as it is) that denies the resources a test forbids in a namespace as the
API server's authorization filter denies a request RBAC does not allow, and passes every other
request through unchanged (watches streamed as they come).

The denial, from kubernetes (staging/src/k8s.io/):
- apiserver/pkg/endpoints/request/requestinfo.go: the verb of a resource request: GET `get`
  (with a name) or `list`, `watch` with `?watch=true`; POST `create`, PUT `update`, PATCH
  `patch` (server-side apply is one), DELETE `delete` or `deletecollection`;
- apiserver/pkg/endpoints/handlers/responsewriters/errors.go (Forbidden, forbiddenMessage):
  `User "<user>" cannot <verb> resource "<resource>[/<subresource>]" in API group "<group>"
  in the namespace "<namespace>"`, RBAC's empty reason adding nothing;
- apimachinery/pkg/api/errors/errors.go (NewForbidden): a v1 Status, 403, reason Forbidden,
  message `<resource>.<group> ["<name>" ]is forbidden: ` that message, details group, kind
  (the resource) and name.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

# What a pipeline step runs as: KFP's default service account for its pods.
STEP_USER = "system:serviceaccount:{namespace}:pipeline-runner"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailers", "upgrade"}
_RESOURCE_PATH = re.compile(r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)"
                            r"/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


@dataclass(frozen=True)
class Denial:
    namespace: str
    group: str
    resource: str


class FrontDoor(ThreadingHTTPServer):
    """The API server behind RBAC that denies what `forbid` names; `kubeconfig` reaches it."""

    daemon_threads = True

    def __init__(self, workdir: Path, upstream: str):
        """`workdir`: the API server's (its pki/ and kubeconfig); `upstream`: its URL."""
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = urlsplit(upstream)
        pki = workdir / "pki"
        self.client_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.client_tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(pki / "server.crt", pki / "server.key")
        self.socket = serving.wrap_socket(self.socket, server_side=True)
        self.denials: set[Denial] = set()
        config = yaml.safe_load((workdir / "kubeconfig").read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.server_address[1]}"
        self.kubeconfig = workdir / f"kubeconfig-frontdoor-{self.server_address[1]}"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        threading.Thread(target=self.serve_forever, daemon=True, name="frontdoor").start()

    def forbid(self, namespace: str, group: str, resource: str) -> None:
        """Deny every verb on `resource` of `group` in `namespace` (no RoleBinding grants it)."""
        self.denials.add(Denial(namespace, group, resource))

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.kubeconfig.unlink(missing_ok=True)


def verb(method: str, name: str | None, query: str) -> str:
    """requestinfo.go's verb of a namespaced resource request."""
    if method == "GET":
        if parse_qs(query).get("watch", [""])[0] in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def forbidden(user: str, verb_: str, group: str, resource: str, namespace: str,
              name: str | None, subresource: str | None) -> dict:  # fmt: skip
    """The Status the API server answers a request its authorizer denies."""
    what = f"{resource}/{subresource}" if subresource else resource
    reason = (f'User "{user}" cannot {verb_} resource "{what}" in API group "{group}" in the '
              f'namespace "{namespace}"')  # fmt: skip
    qualified = f"{resource}.{group}" if group else resource
    message = (f'{qualified} "{name}" is forbidden: {reason}' if name
               else f"{qualified} is forbidden: {reason}")  # fmt: skip
    details = {"group": group, "kind": resource, **({"name": name} if name else {})}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Forbidden", "details": details, "code": 403}


class _Handler(BaseHTTPRequestHandler):
    server: FrontDoor
    protocol_version = "HTTP/1.1"

    def log_message(self, *_) -> None:
        pass

    def _handle(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        m = _RESOURCE_PATH.match(url.path)
        if m and Denial(m["ns"], m["group"], m["resource"]) in self.server.denials:
            status = forbidden(STEP_USER.format(namespace=m["ns"]),
                               verb(self.command, m["name"], url.query), m["group"],
                               m["resource"], m["ns"], m["name"], m["sub"])  # fmt: skip
            data = json.dumps(status).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        upstream = http.client.HTTPSConnection(self.server.upstream.hostname,
                                               self.server.upstream.port,
                                               context=self.server.client_tls, timeout=3600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        with contextlib.closing(upstream):
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Connection", "close")  # the body ends with the connection
            self.end_headers()
            while chunk := response.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle
