"""A real Kubernetes API server with the Kubeflow Trainer v2.3.0 CRDs, for the cluster-side tests.

`../shared/k8s-apiserver/start.sh` runs etcd + apiextensions-apiserver on 127.0.0.1 (schema
validation, CEL rules, defaulting, the status subresource, watch; no core API, no controllers).
tests/conftest.py imports the fixtures, so one server serves every test module.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from components.trainjob.launcher import GROUP, PLURAL, VERSION

CRDS = Path("trainer-crds") / "v2.3.0"
KSERVE_CRDS = Path("kserve-crds") / "v0.20.0"
START = Path("k8s-apiserver") / "start.sh"


def _ephemeral_ports() -> range:
    """The ports the kernel hands out to outgoing connections and to bind(port 0)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


_PICK = random.SystemRandom()  # not the random module's: a test may seed that, in every session


def _free_port() -> int:
    """A free port outside the ephemeral range: one picked inside it may become the local port
    of any connection (the API server's own to etcd among them) before the server binds it."""
    ephemeral = _ephemeral_ports()
    for _ in range(200):
        port = _PICK.randrange(10000, 32000)
        if port in ephemeral or port + 1 in ephemeral:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _free_pair() -> int:
    """A port whose successor is free too (etcd takes ETCD_PORT and ETCD_PORT+1)."""
    for _ in range(50):
        port = _free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports")


@dataclass
class ApiServer:
    workdir: Path
    kubeconfig: Path
    url: str

    def client(self):
        """A fresh `kubernetes.client.ApiClient` for this server."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)


def _wait_healthy(workdir: Path, url: str, deadline_s: float = 60) -> None:
    ctx = ssl.create_default_context(cafile=str(workdir / "pki" / "ca.crt"))
    ctx.load_cert_chain(workdir / "pki" / "admin.crt", workdir / "pki" / "admin.key")
    end = time.monotonic() + deadline_s
    while True:  # /healthz only: /readyz stays red on this server by design
        try:
            with urllib.request.urlopen(f"{url}/healthz", context=ctx, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > end:
                raise
        time.sleep(0.1)


def apply_crds(api_client, paths: list[Path]) -> None:
    """Create the CRDs in `paths` (created, not applied: some are too large for the
    last-applied annotation) and wait until each is Established (served)."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for path in paths:
        # The C loader: these CRDs are 27,000 lines, 3.5 s for the pure-Python one.
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        ext.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])
    end = time.monotonic() + 60
    for name in names:  # wait until each CRD is Established (served)
        while True:
            conds = ext.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                break
            if time.monotonic() > end:
                raise TimeoutError(f"CRD {name} not established")
            time.sleep(0.05)


@contextlib.contextmanager
def running(shared: Path, workdir: Path) -> Iterator[ApiServer]:
    """etcd and the API server in `workdir` with the Trainer CRDs applied (about a second);
    stopped by their pids on exit. The benchmarks use it too."""
    try:
        api_port = _start(shared, workdir)
        server = ApiServer(workdir, workdir / "kubeconfig", f"https://127.0.0.1:{api_port}")
        _wait_healthy(workdir, server.url)
        apply_crds(server.client(), sorted((shared / CRDS).glob("trainer.kubeflow.org_*.yaml")))
        yield server
    finally:
        _stop(workdir)


# A port found free may still be taken before etcd or the API server binds it (by another test
# session's server): start.sh then waits its minute for a server that never comes, so its logs
# are watched, and it is started again on other ports.
_PORT_TAKEN = "address already in use"
_START_TRIES = 5


def _start(shared: Path, workdir: Path) -> int:
    """Start etcd and the API server on free ports; the API server's port."""
    for _ in range(_START_TRIES):
        api_port = _free_port()
        env = dict(os.environ, ETCD_PORT=str(_free_pair()), API_PORT=str(api_port))
        for log in ("etcd.log", "apiserver.log"):
            (workdir / log).unlink(missing_ok=True)
        with subprocess.Popen(["bash", str(shared / START), str(workdir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as start:
            end = time.monotonic() + 120
            while start.poll() is None and time.monotonic() < end:
                if _PORT_TAKEN in _read(workdir / "etcd.log") + _read(workdir / "apiserver.log"):
                    break
                time.sleep(0.1)
            if start.poll() is None:
                start.kill()
            said = start.communicate()[0]
        if start.returncode == 0:
            return api_port
        said += _read(workdir / "etcd.log") + _read(workdir / "apiserver.log")
        _stop(workdir)
        if _PORT_TAKEN not in said:
            break
    raise RuntimeError(f"start.sh failed:\n{said[-3000:]}")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _stop(workdir: Path) -> None:
    for pidfile in ("apiserver.pid", "etcd.pid"):
        path = workdir / pidfile
        if path.exists():
            try:
                os.kill(int(path.read_text().strip()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            path.unlink()


def available(shared: Path) -> str | None:
    """Why there is no API server to start from `shared`, or None when there is."""
    start, crds = shared / START, shared / CRDS
    if not start.is_file() or not crds.is_dir():
        return f"{start} or {crds} is absent: no test API server to run against"
    return None


@pytest.fixture(scope="session")
def apiserver(shared: Path, tmp_path_factory) -> Iterator[ApiServer]:
    """Started once per session, stopped at the end."""
    if reason := available(shared):
        pytest.skip(reason)
    with running(shared, tmp_path_factory.mktemp("apiserver")) as server:
        yield server


@pytest.fixture
def custom_api(apiserver: ApiServer):
    """A `CustomObjectsApi` on the test server."""
    from kubernetes import client

    return client.CustomObjectsApi(apiserver.client())


@pytest.fixture(scope="session")
def kserve_api(apiserver: ApiServer, shared: Path):
    """A `CustomObjectsApi` on the test server, which then also serves KServe v0.20.0's CRDs
    (InferenceService, ServingRuntime, ClusterServingRuntime; the InferenceService's is 2 MB:
    created once a session, as their README says, never applied client-side)."""
    from kubernetes import client

    paths = sorted((shared / KSERVE_CRDS).glob("serving.kserve.io_*.yaml"))
    if len(paths) != 3:
        pytest.skip(f"{shared / KSERVE_CRDS} lacks KServe's CRDs: nothing to validate against")
    apply_crds(apiserver.client(), paths)
    return client.CustomObjectsApi(apiserver.client())


@pytest.fixture
def kubeconfig_env(apiserver: ApiServer, monkeypatch) -> ApiServer:
    """Point the code under test's own kube config loading at the test server."""
    monkeypatch.setenv("KUBECONFIG", str(apiserver.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return apiserver


def apply_cluster_object(api, body: dict, plural: str = "clustertrainingruntimes", *,
                         group: str = GROUP, version: str = VERSION) -> dict:  # fmt: skip
    """Create a cluster-scoped object (a Trainer runtime unless told), or replace the one of
    that name (`kubectl apply` in spirit): tests that share the server may apply the same
    runtimes."""
    from kubernetes.client.rest import ApiException

    try:
        return api.create_cluster_custom_object(group, version, plural, body)
    except ApiException as e:
        if e.status != 409:
            raise
    name = body["metadata"]["name"]
    current = api.get_cluster_custom_object(group, version, plural, name)
    body = {**body, "metadata": {**body["metadata"],
                                 "resourceVersion": current["metadata"]["resourceVersion"]}}
    return api.replace_cluster_custom_object(group, version, plural, name, body)


# ---- playing the Trainer controller ------------------------------------------------------------


def namespace() -> str:
    """A fresh namespace name: this server takes custom resources in any namespace."""
    return f"t-{secrets.token_hex(4)}"


def condition(kind: str, reason: str, message: str) -> dict:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


class Controller(threading.Thread):
    """Plays the Trainer: waits for the launcher's TrainJob, then sets a condition on it."""

    def __init__(self, api, namespace: str, cond: dict | None, delay: float = 0.3):
        super().__init__(daemon=True)
        self.api, self.namespace, self.cond, self.delay = api, namespace, cond, delay
        self.created: dict | None = None
        self.patched_at: float | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            end = time.monotonic() + 30
            while self.created is None and time.monotonic() < end:
                items = self.api.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL
                )["items"]
                self.created = items[0] if items else None
                time.sleep(0.05)  # the test's own poll, not the code under test's
            if self.cond is None or self.created is None:
                return
            time.sleep(self.delay)
            name = self.created["metadata"]["name"]
            # Stamped before the request: a latency measured from here includes the patch itself.
            self.patched_at = time.monotonic()
            status = {"status": {"conditions": [self.cond]}}
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, name, status
            )
        except BaseException as e:  # surfaced by the test
            self.error = e
