"""Kubeflow's Model Registry for tests: Stoplight Prism validating every request and answer
against the upstream OpenAPI spec, in front of a store that keeps what it is sent.

Prism alone (its mock) answers with the spec's examples: it would say a model exists before it
was ever registered, and could not show a second run becoming a second version. So Prism runs as
a validation proxy (`prism proxy --errors`) in front of `Store`, a small in-memory server of the
few operations the registration calls; with `--errors` a request or an answer the spec refuses
becomes an error the client sees (HTTP 422, or 500 with a `sl-violations` header). The store
keeps the client honest about state, the spec (tests/fixtures/model_registry/, with where it
came from) keeps both honest about the contract.

Prism is installed by `make install` (`npm ci` of tests/fixtures/model_registry/'s lock, into
the venv); where it is not, `prism()` skips with the reason.
"""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from support.paths import FIXTURES

CONTRACT = FIXTURES / "model_registry"
SPEC = CONTRACT / "model-registry.yaml"
# `make install` installs it into the venv the tests run in, from CONTRACT's package-lock.
PRISM = Path(sys.prefix) / "prism" / "node_modules" / ".bin" / "prism"
API = "/api/model_registry/v1alpha3"


def discriminated(node: Any) -> Any:
    """The spec with each `oneOf` that has a `discriminator` mapping spelled out in JSON Schema:
    the alternative the discriminator's value names, and only it. OpenAPI 3.0 picks a oneOf's
    schema by that value; Prism's JSON Schema validator ignores `discriminator` and demands
    that exactly one alternative match, which the registry's artifacts (a model artifact's
    fields fit a document artifact too) never do. Nothing else changes."""
    if isinstance(node, list):
        return [discriminated(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: discriminated(value) for key, value in node.items()}
    mapping = node.get("discriminator", {}).get("mapping")
    if "oneOf" in node and mapping:
        prop = node.pop("discriminator")["propertyName"]
        node["oneOf"] = [{"allOf": [{"$ref": ref}, {"type": "object", "required": [prop],
                                                    "properties": {prop: {"enum": [value]}}}]}
                         for value, ref in mapping.items()]  # fmt: skip
    return node


class Store(ThreadingHTTPServer):
    """Registered models, their versions and the versions' artifacts, in memory, as the
    registry's REST API creates, finds and lists them; every request it served, in order."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ids = itertools.count(1)
        self.models: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, dict[str, Any]] = {}
        self.artifacts: dict[str, list[dict[str, Any]]] = {}  # by version id
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, JSON body)

    def created(self, body: dict[str, Any], **more: Any) -> dict[str, Any]:
        now = str(int(time.time() * 1000))
        return {**body, **more, "id": str(next(self.ids)), "createTimeSinceEpoch": now,
                "lastUpdateTimeSinceEpoch": now}  # fmt: skip


def _page(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"items": items, "size": len(items), "pageSize": max(len(items), 1),
            "nextPageToken": ""}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    server: Store

    def log_message(self, *args: Any) -> None:  # quiet: the test reads `requests`
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, what: str) -> None:
        self._answer(404, {"code": "NotFound", "message": f"{what} not found"})

    def _found(self, matches: list[dict[str, Any]], what: str) -> None:
        """A find: the one match, else 404 (names are unique, a version's within its model)."""
        if matches:
            self._answer(200, matches[0])
        else:
            self._not_found(what)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.server.requests.append(("GET", url.path, query))
        store, path = self.server, url.path.removeprefix(API)
        parts = path.strip("/").split("/")
        if path == "/registered_models":
            self._answer(200, _page(list(store.models.values())))
        elif path == "/registered_model":
            self._found([m for m in store.models.values() if m["name"] == query.get("name")],
                        "registered model")  # fmt: skip
        elif path == "/model_version":
            self._found([v for v in store.versions.values() if v["name"] == query.get("name")
                         and v["registeredModelId"] == query.get("parentResourceId")],
                        "model version")  # fmt: skip
        elif parts[0] == "registered_models" and parts[2:] == ["versions"]:
            self._answer(200, _page([v for v in store.versions.values()
                                     if v["registeredModelId"] == parts[1]]))  # fmt: skip
        elif parts[0] == "model_versions" and parts[2:] == ["artifacts"]:
            self._answer(200, _page(store.artifacts.get(parts[1], [])))
        else:
            self._not_found(path)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = urlparse(self.path).path
        self.server.requests.append(("POST", path, body))
        store, parts = self.server, path.removeprefix(API).strip("/").split("/")
        if parts == ["registered_models"]:
            model = store.created(body, state=body.get("state", "LIVE"))
            store.models[model["id"]] = model
            self._answer(201, model)
        elif parts == ["model_versions"]:
            if body["registeredModelId"] not in store.models:
                return self._not_found("registered model")
            version = store.created(body, state=body.get("state", "LIVE"))
            store.versions[version["id"]] = version
            self._answer(201, version)
        elif parts[0] == "model_versions" and parts[2:] == ["artifacts"]:
            if parts[1] not in store.versions:
                return self._not_found("model version")
            artifact = store.created(body)
            store.artifacts.setdefault(parts[1], []).append(artifact)
            self._answer(201, artifact)
        else:
            self._not_found(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prism(upstream: str) -> Iterator[tuple[str, Path]]:
    """Prism validating against the vendored spec, proxying to `upstream`: its address and the
    file its log goes to. Skips, with the reason, where `make install` could not install it."""
    if not PRISM.exists():
        why = ("npm is not installed" if shutil.which("npm") is None
               else "run `make install` (npm ci of tests/fixtures/model_registry/'s lock)")
        pytest.skip(f"Stoplight Prism is not installed at {PRISM}: {why}")
    port = _free_port()
    log = PRISM.parents[2] / f"prism-{port}.log"
    spec = PRISM.parents[2] / f"prism-{port}.yaml"
    spec.write_text(yaml.safe_dump(discriminated(yaml.safe_load(SPEC.read_text()))))
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(PRISM), "proxy", str(spec), upstream, "--errors", "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "Prism is listening" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prism did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.unlink(missing_ok=True)
        spec.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def model_registry() -> Iterator[tuple[str, Store, Path]]:
    """The registry, one a session (Prism takes seconds to start): Prism's address, the store
    behind it and Prism's log. Tests share the store: each registers its own model names."""
    store = Store()
    thread = threading.Thread(target=store.serve_forever, daemon=True)
    thread.start()
    try:
        with prism(f"http://127.0.0.1:{store.server_address[1]}") as (address, log):
            yield address, store, log
    finally:
        store.shutdown()
        store.server_close()
