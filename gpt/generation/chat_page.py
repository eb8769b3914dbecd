"""The chat page: generative-prompt's model in a browser (`--web_port PORT`).

One small page (chat_page.html, no framework, no download) and a JSON API under /api, served by
the standard library's threading HTTP server on the loopback interface only: on a cluster it is
reached with `kubectl port-forward`, which connects to the pod's own localhost, so nothing of it
is exposed to the cluster's network, and it has no login to protect. Each browser tab opens a
conversation of its own (a Session, session.py: its turns, settings and seeds, as the terminal
has); replies stream as JSON Lines while they are sampled, one at a time (one model), and every
reply joins the run's transcript as the terminal's do.

Bounds: a request's body is at most MAX_BODY_BYTES and a message at most MAX_LINE_CHARS (the
terminal's longest line); at most MAX_CONVERSATIONS tabs hold a conversation, a closed tab's is
dropped, and when all are taken the one idle longest goes if it has been idle for IDLE_DROP_S,
else the new tab is told to close one. Requests that do not come from a page on localhost
(another site in the same browser, a DNS-rebound name) are refused.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from gpt.generation.repl import MAX_LINE_CHARS
from gpt.generation.session import Refused, Session

MAX_BODY_BYTES = 4 * MAX_LINE_CHARS + 1024  # the longest message, 4 UTF-8 bytes a character
MAX_CONVERSATIONS = 8
IDLE_DROP_S = 600.0
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
PAGE = resources.files("gpt.generation").joinpath("chat_page.html").read_bytes()
_CONVERSATION = re.compile(r"^/api/conversations/([0-9a-f]{12})(/[a-z]+)?$")


class HTTPError(Exception):
    """An answer other than success: its status and a one-line reason for the person."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Tab:
    """One tab's conversation and when it was last used."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.used = time.monotonic()
        self.replying = False


class ChatServer(ThreadingHTTPServer):
    """The page's server: the tabs' conversations and the one lock their replies share."""

    daemon_threads = True  # a stopped server does not wait for a stream nobody reads

    def __init__(self, port: int, new_session: Callable[[str], Session],
                 info: dict[str, Any]) -> None:  # fmt: skip
        """`new_session(system)`: a tab's conversation; `info`: what the page shows of the
        model (its description, whether it chats, the default system prompt)."""
        super().__init__(("127.0.0.1", port), Handler)
        self.new_session = new_session
        self.info = {**info, "max_message_chars": MAX_LINE_CHARS}
        self.tabs: OrderedDict[str, Tab] = OrderedDict()  # least recently used first
        self.tabs_lock = threading.Lock()
        self.model_lock = threading.Lock()  # one reply at a time: they share the model
        self.last_request = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://localhost:{self.server_address[1]}/"

    def open_tab(self, system: str) -> str:
        session = self.new_session(system)
        tab = uuid.uuid4().hex[:12]
        with self.tabs_lock:
            if len(self.tabs) >= MAX_CONVERSATIONS:
                oldest_id, oldest = next(iter(self.tabs.items()))
                if oldest.replying or time.monotonic() - oldest.used < IDLE_DROP_S:
                    raise HTTPError(HTTPStatus.TOO_MANY_REQUESTS,
                                    f"{MAX_CONVERSATIONS} conversations are open, one per tab: "
                                    "close a tab, then reload this one")
                del self.tabs[oldest_id]
            self.tabs[tab] = Tab(session)
        return tab

    def tab(self, conversation: str) -> Tab:
        with self.tabs_lock:
            tab = self.tabs.get(conversation)
            if tab is None:
                raise HTTPError(HTTPStatus.NOT_FOUND, "this conversation was closed (a tab idle "
                                "too long gives its place to a new one): reload the page")
            self.tabs.move_to_end(conversation)
            tab.used = time.monotonic()
            return tab

    def close_tab(self, conversation: str) -> None:
        with self.tabs_lock:
            self.tabs.pop(conversation, None)


class Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's API)
        pass  # a line per request would bury the stage's log; replies are in the transcript

    def do_GET(self) -> None:  # noqa: N802 (http.server's API)
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post)

    def _answer(self, route: Callable[[], None]) -> None:
        self.server.last_request = time.monotonic()
        try:
            self._check_origin()
            route()
        except HTTPError as e:
            self._send(e.status, {"error": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the tab went away mid-answer

    def _check_origin(self) -> None:
        """Only a page on localhost may ask: the Host a browser sends, and the Origin it adds
        to a page's POST, must name localhost (another site's page, or a name rebound to
        127.0.0.1, names its own)."""
        host = urlsplit(f"//{self.headers.get('Host', '')}").hostname or ""
        origin = self.headers.get("Origin")
        origin_host = urlsplit(origin).hostname if origin else "localhost"
        if host not in LOCAL_HOSTS or origin_host not in LOCAL_HOSTS:
            raise HTTPError(HTTPStatus.FORBIDDEN, "only a page on localhost may use this "
                            "server (kubectl port-forward, then http://localhost:PORT/)")

    def _get(self) -> None:
        path = urlsplit(self.path).path
        if path == "/":
            self._send_bytes(HTTPStatus.OK, PAGE, "text/html; charset=utf-8")
        elif path == "/api/info":
            self._send(HTTPStatus.OK, self.server.info)
        elif (match := _CONVERSATION.match(path)) and match[2] == "/download":
            session = self.server.tab(match[1]).session
            if session.conversation is None:
                raise HTTPError(HTTPStatus.NOT_FOUND, "a text model holds no conversation")
            line = json.dumps({"messages": session.conversation.messages()},
                              ensure_ascii=False) + "\n"  # fmt: skip
            self._send_bytes(HTTPStatus.OK, line.encode(), "application/jsonl; charset=utf-8",
                             {"Content-Disposition": 'attachment; filename="conversation-'
                                                     f'{match[1]}.jsonl"'})  # fmt: skip
        else:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"no page {path}")

    def _post(self) -> None:
        path = urlsplit(self.path).path
        body = self._body()
        if path == "/api/conversations":
            system = _text(body, "system", optional=True)
            try:
                conversation = self.server.open_tab(system)
            except Refused as e:
                raise HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
            self._send(HTTPStatus.CREATED, {"conversation": conversation})
            return
        match = _CONVERSATION.match(path)
        if not match or match[2] not in ("/messages", "/reset", "/close"):
            raise HTTPError(HTTPStatus.NOT_FOUND, f"no page {path}")
        if match[2] == "/close":  # the tab is closing (navigator.sendBeacon)
            self.server.close_tab(match[1])
            self._send(HTTPStatus.OK, {})
            return
        tab = self.server.tab(match[1])
        if match[2] == "/reset":
            try:
                tab.session.set_system(_text(body, "system", optional=True))
                tab.session.reset()
            except Refused as e:
                raise HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
            self._send(HTTPStatus.OK, {"conversation": match[1]})
        else:
            self._reply(tab, _text(body, "content"))

    def _reply(self, tab: Tab, content: str) -> None:
        """Stream the reply to `content` as JSON Lines: {"note"}s, {"text"} pieces, then
        {"end": why it stopped}."""
        if len(content) > MAX_LINE_CHARS:
            raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"the message is {len(content):,} characters; at most "
                            f"{MAX_LINE_CHARS:,}")  # fmt: skip
        with self.server.tabs_lock:  # two requests of one tab at once: one replies
            if tab.replying:
                raise HTTPError(HTTPStatus.CONFLICT,
                                "this conversation's reply is still streaming")
            tab.replying = True
        try:
            prepared = tab.session.prepare(content)
        except Refused as e:
            tab.replying = False
            raise HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/jsonl; charset=utf-8")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Transfer-Encoding", "chunked")  # HTTP/1.1's stream of pieces
            self.end_headers()
            for note in prepared.notes:
                self._event({"note": note})
            if not self.server.model_lock.acquire(blocking=False):
                self._event({"note": "another tab's reply is being written; yours follows"})
                self.server.model_lock.acquire()
            try:
                with contextlib.closing(tab.session.stream(prepared)) as pieces:
                    for piece in pieces:
                        self._event({"text": piece})  # a closed tab raises here: recorded
            finally:
                self.server.model_lock.release()
        finally:  # before the end is sent: a client may ask again the moment it has it
            tab.replying = False
            tab.used = time.monotonic()
        self._event({"end": tab.session.last_stopped})
        self._chunk(b"")  # the body's end

    def _event(self, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps(obj, ensure_ascii=False).encode() + b"\n")

    def _chunk(self, data: bytes) -> None:
        """One chunk of a chunked body, sent now; empty: the last."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        """The request's JSON object, read only within MAX_BODY_BYTES."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED,
                            "a request needs a Content-Length") from None  # fmt: skip
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # its body is left unread
            raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"the request is {length:,} bytes; at most {MAX_BODY_BYTES:,}")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"the request is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "the request is not a JSON object")
        return body

    def _send(self, status: HTTPStatus, obj: dict[str, Any]) -> None:
        self._send_bytes(status, json.dumps(obj, ensure_ascii=False).encode(),
                         "application/json; charset=utf-8")  # fmt: skip

    def _send_bytes(self, status: HTTPStatus, data: bytes, content_type: str,
                    headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _text(body: dict[str, Any], name: str, optional: bool = False) -> str:
    value = body.get(name, "" if optional else None)
    if not isinstance(value, str):
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"'{name}' must be a string")
    return value


def serve(server: ChatServer, idle_timeout: float, say: Callable[[str], None]) -> str:
    """Serve until Ctrl-C or `idle_timeout` seconds (0: never) without a request; why it ended."""
    thread = threading.Thread(target=server.serve_forever, name="chat-page", daemon=True)
    thread.start()
    say(f"Chat page: {server.url} (Ctrl-C ends it)")
    try:
        while True:
            time.sleep(0.5)
            if idle_timeout and time.monotonic() - server.last_request > idle_timeout:
                with server.tabs_lock:  # a tab may open meanwhile
                    busy = any(tab.replying for tab in server.tabs.values())
                if not busy:
                    return f"no request for {idle_timeout:g} s"
    except KeyboardInterrupt:
        return "interrupted"
    finally:
        server.shutdown()
        server.server_close()

