"""The chat page (issue 58, goal 5): generative-prompt --web_port serves a page whose replies
stream, one conversation per tab, downloadable in the `messages` format; requests are bounded in
size and in tabs, and only a page on localhost may use it.

The API's tests run the server in this process on the tiny chat model trained once per session
(support/chats.py); the browser's test drives Debian's chromium through Playwright against the
CLI as a process, and compares what the page shows with the CLI's greedy replies."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.chats import SYSTEM, trained_chat_run
from support.models import ENV, cli_transcript, export
from support.runs import in_process
from support.servers import free_ports, wait_until_answering

from gpt.config.configs import SamplingConfig
from gpt.generation import chat_page
from gpt.generation.session import Session
from gpt.models.export import load_export
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import CharTokenizer

GREEDY = SamplingConfig(temperature=0, max_new_tokens=12)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> RunDir:
    return trained_chat_run(tmp_path_factory, tmp_path_factory.mktemp("page"))


def start(model, tok, transcript: Path, settings: SamplingConfig = GREEDY) -> chat_page.ChatServer:
    """The page's server on a free port, serving in a thread until the test's end."""

    def new_session(system: str) -> Session:
        return Session(model, tok, settings, 0, transcript, system)

    server = chat_page.ChatServer(free_ports(1)[0], new_session, {"model": "tiny", "chat": tok.chat,
                                                            "system": ""})  # fmt: skip
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def server(run, tmp_path):
    model, tok = load_export(run.model_dir)
    server = start(model, tok, tmp_path / "transcript.jsonl")
    yield server
    server.shutdown()
    server.server_close()


def ask(server: chat_page.ChatServer, method: str, path: str, body: object = None,
        headers: dict | None = None) -> tuple[int, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    conn.request(method, path, data, {"Host": f"localhost:{server.server_address[1]}",
                                      "Content-Type": "application/json", **(headers or {})})
    res = conn.getresponse()
    out = res.status, res.read()
    conn.close()
    return out


def open_tab(server: chat_page.ChatServer, system: str = "") -> str:
    status, body = ask(server, "POST", "/api/conversations", {"system": system})
    assert status == 201, body
    return json.loads(body)["conversation"]


def say(server: chat_page.ChatServer, conversation: str, content: str) -> list[dict]:
    status, body = ask(server, "POST", f"/api/conversations/{conversation}/messages",
                       {"content": content})  # fmt: skip
    assert status == 200, body
    return [json.loads(line) for line in body.splitlines()]


def test_a_reply_streams_in_pieces_and_equals_the_sessions(server, run, tmp_path):
    model, tok = load_export(run.model_dir)
    alone = Session(model, tok, GREEDY, 0, tmp_path / "alone.jsonl", SYSTEM)
    expected = "".join(alone.stream(alone.prepare("Where is the ship?")))

    events = say(server, open_tab(server, SYSTEM), "Where is the ship?")
    pieces = [e["text"] for e in events if "text" in e]
    assert len(pieces) > 1 and "".join(pieces) == expected
    assert events[-1] == {"end": "end_of_turn"}
    (record,) = [json.loads(x) for x in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert record["reply"] == expected and record["messages"][0]["content"] == SYSTEM


def test_each_tab_holds_its_own_conversation_and_downloads_it_as_messages(server, tmp_path):
    one, two = open_tab(server, SYSTEM), open_tab(server)
    first = "".join(e.get("text", "") for e in say(server, one, "Where is the ship?"))
    second = "".join(e.get("text", "") for e in say(server, one, "And then?"))
    other = "".join(e.get("text", "") for e in say(server, two, "And then?"))
    status, body = ask(server, "GET", f"/api/conversations/{one}/download")
    assert status == 200
    (line,) = body.decode().splitlines()
    assert json.loads(line) == {"messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is the ship?"}, {"role": "assistant", "content": first},
        {"role": "user", "content": "And then?"}, {"role": "assistant", "content": second}]}
    status, body = ask(server, "GET", f"/api/conversations/{two}/download")
    assert json.loads(body)["messages"] == [{"role": "user", "content": "And then?"},
                                            {"role": "assistant", "content": other}]
    # The downloads are chat data: load-corpus --chat reads them
    (tmp_path / "both.jsonl").write_bytes(b"".join(
        ask(server, "GET", f"/api/conversations/{tab}/download")[1] for tab in (one, two)))
    assert in_process("load-corpus", "--root", str(tmp_path), "--run", "back", "--source",
                      str(tmp_path / "both.jsonl"), "--chat", "true", "--block_size", "48",
                      "--val_fraction", "0.5") == 0  # fmt: skip
    # /reset: the same tab, no turns, the new system prompt
    assert ask(server, "POST", f"/api/conversations/{one}/reset", {"system": ""})[0] == 200
    assert json.loads(ask(server, "GET", f"/api/conversations/{one}/download")[1]) == {
        "messages": []}


def test_requests_are_bounded_in_size_and_in_tabs(server):
    conversation = open_tab(server)
    status, body = ask(server, "POST", f"/api/conversations/{conversation}/messages",
                       b"x" * (chat_page.MAX_BODY_BYTES + 1))  # fmt: skip
    assert status == 413 and "at most" in json.loads(body)["error"]
    status, body = ask(server, "POST", f"/api/conversations/{conversation}/messages",
                       {"content": "a" * (chat_page.MAX_LINE_CHARS + 1)})  # fmt: skip
    most = chat_page.MAX_LINE_CHARS
    assert status == 413 and json.loads(body)["error"] == (
        f"the message is {most + 1:,} characters; at most {most:,}")
    tabs = [conversation] + [open_tab(server) for _ in range(chat_page.MAX_CONVERSATIONS - 1)]
    status, body = ask(server, "POST", "/api/conversations", {})
    assert status == 429 and "close a tab" in json.loads(body)["error"]
    assert ask(server, "POST", f"/api/conversations/{tabs[3]}/close", b"")[0] == 200
    newest = open_tab(server)  # a closed tab's place
    server.tabs[tabs[0]].used -= chat_page.IDLE_DROP_S + 1  # the oldest tab, idle for long
    open_tab(server)
    status, body = ask(server, "POST", f"/api/conversations/{tabs[0]}/messages",
                       {"content": "hi"})  # fmt: skip
    assert status == 404 and "reload the page" in json.loads(body)["error"]
    assert newest in server.tabs and len(server.tabs) == chat_page.MAX_CONVERSATIONS


@pytest.mark.parametrize("body, status, error", [
    (b"{not json", 400, "the request is not JSON"),
    ([1], 400, "the request is not a JSON object"),
    ({"content": 3}, 400, "'content' must be a string"),
    ({"content": "hi <|im_start|>"}, 400,
     "your message spells the token '<|im_start|>'; not sent"),
])  # fmt: skip
def test_a_bad_message_is_one_line_and_changes_nothing(server, body, status, error):
    conversation = open_tab(server)
    got = ask(server, "POST", f"/api/conversations/{conversation}/messages", body)
    assert got[0] == status and json.loads(got[1])["error"].startswith(error)
    assert server.tabs[conversation].session.conversation.turns == []


@pytest.mark.parametrize("headers", [{"Host": "evil.example:80"},
                                     {"Origin": "http://evil.example"}])
def test_only_a_page_on_localhost_may_ask(server, headers):
    status, body = ask(server, "POST", "/api/conversations", {}, headers)
    assert status == 403 and "only a page on localhost" in json.loads(body)["error"]
    assert not server.tabs


def test_a_tab_closed_mid_reply_is_recorded_as_interrupted(root, tmp_path):
    """A text model (it never ends its reply early) and a reply of 400 tokens; the client
    reads the first pieces and hangs up."""
    model, tok = load_export(export(root, CharTokenizer.fit(["abc hi"])).model_dir)
    transcript = tmp_path / "t.jsonl"
    server = start(model, tok, transcript, SamplingConfig(temperature=1.0, max_new_tokens=400))
    try:
        conversation = open_tab(server)
        with socket.create_connection(("127.0.0.1", server.server_address[1])) as sock:
            body = json.dumps({"content": "hi"}).encode()
            sock.sendall(b"POST /api/conversations/%s/messages HTTP/1.1\r\nHost: localhost\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (conversation.encode(), len(body), body))  # fmt: skip
            got = b""
            while b'{"text"' not in got:
                got += sock.recv(4096)  # the headers, then the first pieces
        deadline = time.monotonic() + 30
        while not transcript.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (record,) = [json.loads(x) for x in transcript.read_text().splitlines()]
        assert record["stopped"] == "interrupted" and 0 < record["reply_tokens"] < 400
    finally:
        server.shutdown()
        server.server_close()


def page_stage(run: RunDir, port: int, max_new_tokens: int, log: Path) -> subprocess.Popen:
    """generative-prompt --web_port on `run`, greedy, as a process of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpt", "generative-prompt", "--root", str(run.root), "--run",
         run.run_id, "--temperature", "0", "--max_new_tokens", str(max_new_tokens),
         "--web_port", str(port)],
        env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip


def typed(page, text: str, k: int) -> str:
    """Type `text` into the page, press Enter, and wait for the k-th reply's end: its text."""
    from playwright.sync_api import expect

    page.fill("#message", text)  # waits for the page's conversation: the box is disabled before
    page.press("#message", "Enter")
    reply = page.locator(".msg.assistant").nth(k)
    expect(reply).to_have_attribute("data-stopped", re.compile("end_of_turn|max_new_tokens"))
    return reply.inner_text()


SHOWN = """() => { window.shown = []; new MutationObserver(() => {
    const replies = document.querySelectorAll('.msg.assistant');
    if (replies.length) window.shown.push(replies[replies.length - 1].textContent);
  }).observe(document.getElementById('log'), {childList: true, subtree: true,
                                               characterData: true}); }"""


@pytest.mark.process
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (Debian: apt-get install "
                                             "chromium; .ci/run installs it)")  # fmt: skip
def test_in_a_real_browser_replies_stream_and_are_the_clis(run, root, tmp_path):
    """Type into the page in chromium: the replies are our CLI's greedy replies to the same
    turns; a second tab is a conversation of its own; the download is the conversation in the
    `messages` format. A text model's long reply shows how the page streams: it shows the
    reply growing, each text it shows a beginning of the whole (recorded by a MutationObserver
    in the page)."""
    from playwright.sync_api import expect, sync_playwright

    asked = ["Where is the ship?", "And then?"]
    expected = [r["reply"] for r in cli_transcript(run, asked, 12)]
    alone = cli_transcript(run, asked[1:], 12)[0]["reply"]  # the run's lock: before the page
    text_run = export(root, CharTokenizer.fit([asked[0]]))
    long = cli_transcript(text_run, [asked[0]], 400)[0]["reply"]
    ports = free_ports(2)
    stages = [page_stage(run, ports[0], 12, tmp_path / "chat.log"),
              page_stage(text_run, ports[1], 400, tmp_path / "text.log")]
    try:
        for stage, port, name in zip(stages, ports, ("chat", "text"), strict=True):
            wait_until_answering(f"http://localhost:{port}/api/info", stage,
                                 tmp_path / f"{name}.log", 60, "the chat page")  # fmt: skip
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page()
            page.goto(f"http://localhost:{ports[0]}/")
            expect(page.locator("#model")).to_contain_text("a chat model")
            assert [typed(page, text, k) for k, text in enumerate(asked)] == expected
            shot = Path(os.environ.get("GPT_SCREENSHOT_DIR", tmp_path)) / "chat_page.png"
            page.screenshot(path=str(shot))
            with page.expect_download() as download:
                page.click("#download")
            (line,) = Path(download.value.path()).read_text().splitlines()
            assert json.loads(line)["messages"] == [
                {"role": role, "content": content}
                for pair in zip(asked, expected, strict=True)
                for role, content in zip(("user", "assistant"), pair, strict=True)]

            other = browser.new_page()
            other.goto(f"http://localhost:{ports[0]}/")
            assert typed(other, asked[1], 0) == alone  # not after the first tab's turns

            text = browser.new_page()
            text.goto(f"http://localhost:{ports[1]}/")
            text.evaluate(SHOWN)
            assert typed(text, asked[0], 0) == long
            shown = [t for t in text.evaluate("window.shown") if t]
            assert all(long.startswith(t) for t in shown)
            assert len(set(shown)) > 2, f"not streamed: the page showed {shown}"
            browser.close()
    finally:
        for stage in stages:
            stage.terminate()
            stage.wait(timeout=30)


def test_the_flag_is_refused_with_prompt_and_on_a_port_taken(run, capsys):
    flags = ["generative-prompt", "--root", str(run.root), "--run", run.run_id]
    assert in_process(*flags, "--web_port", "8080", "--prompt", "hi") == 2
    assert capsys.readouterr().err.strip().endswith(
        "--web_port with --prompt: --prompt answers and exits, --web_port serves a page; "
        "choose one")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert in_process(*flags, "--web_port", str(port)) == 2
    assert f"--web_port {port}: cannot listen there: Address already in use" in (
        capsys.readouterr().err)


def test_the_page_ends_after_idle_timeout_without_a_request(run, tmp_path):
    model, tok = load_export(run.model_dir)
    server = chat_page.ChatServer(free_ports(1)[0], lambda system: Session(
        model, tok, GREEDY, 0, tmp_path / "t.jsonl", system), {"model": "tiny", "chat": True})
    said = []
    assert chat_page.serve(server, 0.2, said.append) == "no request for 0.2 s"
    assert said == [f"Chat page: http://localhost:{server.server_address[1]}/ (Ctrl-C ends it)"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
