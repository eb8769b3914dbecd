"""A local HTTP server of corpus texts, with routes that fail as the web does (conftest.py's
`web_server` fixture, for the corpus stage's URL sources)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.paths import FIXTURES

GUTENBERG = (FIXTURES / "gutenberg_sample.txt").read_bytes()


class Handler(BaseHTTPRequestHandler):
    """Routes: /pg.txt the Gutenberg fixture, /flaky 503 twice then the text, /missing 404,
    /slow answers too late, /big claims too many bytes, /stream sends too many without a length."""

    hits: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on purpose (timeouts, size caps)

    def _route(self) -> None:
        self.hits[self.path] = self.hits.get(self.path, 0) + 1
        if self.path == "/pg.txt" or (self.path == "/flaky" and self.hits[self.path] > 2):
            self._send(200, GUTENBERG)
        elif self.path == "/flaky":
            self._send(503, b"busy")
        elif self.path == "/slow":
            time.sleep(1.0)
            self._send(200, GUTENBERG)
        elif self.path == "/big":
            self._send(200, b"x" * 2_000_000)
        elif self.path == "/stream":
            self.send_response(200)
            self.end_headers()  # no Content-Length: the client must count as it reads
            for _ in range(40):
                self.wfile.write(b"y" * 50_000)
        else:
            self._send(404, b"not here")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web_server() -> Iterator[str]:
    """The server's address, `http://127.0.0.1:<port>`, for one test module."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
