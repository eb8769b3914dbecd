"""A local fake of the few Hugging Face Hub endpoints huggingface_hub's HfFileSystem calls to list
and read a dataset repository, so that hf:// sources are tested through huggingface_hub's own
code (its URL building, pagination, error mapping, streamed reads) without the network.

Served (dataset repositories only, `main` and any other revision the test gives):
  GET  /api/datasets/ORG/NAME[/revision/REV]         repo_info: the repository exists
  GET  /api/datasets/ORG/NAME/tree/REV[/PATH]        list_repo_tree: a folder's entries
  POST /api/datasets/ORG/NAME/paths-info/REV         get_paths_info: a path's entry
  GET  /datasets/ORG/NAME/resolve/REV/PATH           a file's bytes (Range honoured)
A repository made with `token=` answers 401 to a request without `Authorization: Bearer
<token>`, as the Hub does for a private or gated one. Not the real Hub: its answers carry only
the fields huggingface_hub reads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    """A dataset repository: revision -> {path in the repository: bytes}."""

    revisions: dict[str, dict[str, bytes]] = field(default_factory=dict)
    token: str | None = None


class HubServer:
    """`with HubServer() as hub:` then `hub.add("org/name", {"data/x.parquet": b"..."})`, and
    HF_ENDPOINT=hub.url. `hub.requests` lists what was asked (method, path)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add(self, repo_id: str, files: dict[str, bytes], revision: str = "main",
            token: str | None = None) -> None:
        repo = self.repos.setdefault(repo_id, Repo(token=token))
        repo.revisions[revision] = dict(files)

    def __enter__(self) -> HubServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        self._route("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._route("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        self.server_hub.requests.append((method, path))
        api = path.startswith("/api/datasets/")
        parts = path.split("/")[3 if api else 2 :]
        if len(parts) < 2:
            return self._json(404, {"error": "not a dataset path"})
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        repo = self.server_hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            return self._error(401, "RepoNotFound", "Invalid username or password.")
        if not api:  # /datasets/ORG/NAME/resolve/REV/PATH
            return self._file(repo, rest, method)
        if not rest or rest[0] == "revision":
            rev = rest[1] if len(rest) > 1 else "main"
            if rev not in repo.revisions:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return self._json(200, {"id": repo_id, "sha": _sha(repo_id + rev), "private": False})
        op, rev, sub = rest[0], rest[1] if len(rest) > 1 else "main", "/".join(rest[2:])
        files = repo.revisions.get(rev)
        if files is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if op == "tree":
            return self._tree(files, sub)
        if op == "paths-info":
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            wanted = form.get("paths", [])
            return self._json(200, [e for p in wanted if (e := _entry(files, p))])
        return self._json(404, {"error": f"no route {op}"})

    def _tree(self, files: dict[str, bytes], folder: str) -> None:
        prefix = f"{folder}/" if folder else ""
        if folder and not any(p.startswith(prefix) for p in files):
            return self._error(404, "EntryNotFound", f"{folder} does not exist")
        names = {p[len(prefix) :].split("/")[0] for p in files if p.startswith(prefix)}
        self._json(200, [_entry(files, prefix + n) for n in sorted(names)])

    def _file(self, repo: Repo, rest: list[str], method: str) -> None:
        if len(rest) < 3 or rest[0] != "resolve":
            return self._json(404, {"error": "no route"})
        files = repo.revisions.get(rest[1])
        data = None if files is None else files.get("/".join(rest[2:]))
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            if start >= len(data):
                return self._send(416, b"", "application/octet-stream")
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{_sha(data.hex())}"')
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), "application/json",
                   {"X-Error-Code": code, "X-Error-Message": message})

    def _json(self, status: int, body: object) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _entry(files: dict[str, bytes], path: str) -> dict[str, object] | None:
    """A path's tree entry: a file's (size, oid) or a folder's."""
    path = path.strip("/")
    if path in files:
        return {"type": "file", "path": path, "size": len(files[path]), "oid": _sha(path)}
    if any(p.startswith(path + "/") for p in files):
        return {"type": "directory", "path": path, "oid": _sha(path)}
    return None
