"""`python -m gpt generative-prompt` end to end: a real pseudo-terminal, a pipe, --prompt, bad
models.

Each test exports a tiny random GPT into a run directory, as train-gpt would, and drives the CLI
as a separate process. Timeouts are generous because the test machine is small and shared.
"""

from __future__ import annotations

import io
import json
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from support.models import ENV, RUN, args, export, one_shot
from support.runs import TINY_MODEL

from gpt.config.configs import SamplingConfig
from gpt.generation.repl import GOODBYE, HOW_TO_LEAVE, NOTE, PROMPT, REPLY, Chat
from gpt.generation.session import Session
from gpt.models.export import WEIGHTS
from gpt.models.model import GPT, GPTConfig
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer

TEXT = "ANTIPHOLUS: To be, or not to be, that is the question!\n"
TIMEOUT = 20


@pytest.fixture
def rundir(root: Path) -> RunDir:
    return export(root, CharTokenizer.fit([TEXT]))


def spawn(rundir: RunDir, *extra: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable, args(rundir, "--max_new_tokens", "12", *extra),
        env=ENV, encoding="utf-8", timeout=TIMEOUT,
    )
    child.expect_exact(PROMPT)
    return child


def finished(child: pexpect.spawn) -> int:
    child.expect_exact(GOODBYE)
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def transcript(rundir: RunDir) -> list[dict]:
    return [json.loads(line) for line in rundir.transcript_jsonl.read_text().splitlines()]


@pytest.mark.process
def test_terminal_session_prompt_reply_settings_empty_line_ctrl_c_exit(rundir: RunDir) -> None:
    child = spawn(rundir)
    child.sendline("To be")
    child.expect_exact(REPLY)
    child.expect_exact(PROMPT)  # the reply ended and the loop asks again
    child.sendline("/temperature 0.5")
    child.expect_exact("temperature 0.5")
    child.expect_exact(PROMPT)
    child.sendline("/top_p 2")  # refused, the session goes on
    child.expect_exact("must be in (0, 1]")
    child.expect_exact(PROMPT)
    child.sendline("")  # an empty line just asks again
    child.expect_exact(PROMPT)
    child.sendline("or not")
    child.expect_exact(REPLY)
    child.expect_exact(PROMPT)
    child.sendintr()  # at the prompt: the session stays, and says how to leave
    child.expect_exact(HOW_TO_LEAVE)
    child.expect_exact(PROMPT)
    child.sendline("exit")
    assert finished(child) == 0
    lines = transcript(rundir)
    assert [(t["prompt"], t["temperature"], t["top_p"]) for t in lines] == [
        ("To be", 0.8, 1.0),
        ("or not", 0.5, 1.0),
    ]
    assert all(t["reply_tokens"] == 12 and len(t["reply"]) == 12 for t in lines)


@pytest.mark.process
def test_ctrl_c_on_the_terminal_stops_the_reply_and_the_session_goes_on(rundir: RunDir) -> None:
    """As `kubectl attach -it` delivers it: 0x03 on the pseudo-terminal, which its line
    discipline turns into SIGINT to the foreground process group, mid-reply."""
    child = spawn(rundir, "--max_new_tokens", "1000000")  # a reply that would go on for minutes
    child.sendline("To be")
    child.expect_exact(REPLY)
    child.expect(r"\S{20}")  # well into the reply
    child.sendintr()
    child.expect_exact(f"{NOTE}reply interrupted")
    child.expect_exact(PROMPT)
    child.sendline("/max_new_tokens 5")
    child.expect_exact(PROMPT)
    child.sendline("or not")  # the session answers again
    child.expect_exact(REPLY)
    child.expect_exact(PROMPT)
    child.sendline("exit")
    assert finished(child) == 0
    first, second = transcript(rundir)
    assert first["stopped"] == "interrupted" and 20 <= first["reply_tokens"] < 1000000
    assert (second["prompt"], second["stopped"], second["reply_tokens"]) == (
        "or not", "max_new_tokens", 5)


@pytest.mark.process
def test_sigterm_ends_the_session(rundir: RunDir) -> None:
    """The pod's deletion: the session ends at once, its transcript whole so far."""
    child = spawn(rundir)
    child.sendline("To be")
    child.expect_exact(PROMPT)
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus == signal.SIGTERM
    assert [t["prompt"] for t in transcript(rundir)] == ["To be"]


@pytest.mark.process
@pytest.mark.parametrize("leave", ["eof", "exit", "quit"])
def test_terminal_session_ends_cleanly_on_ctrl_d_exit_quit(rundir: RunDir, leave: str) -> None:
    child = spawn(rundir)
    if leave == "eof":
        child.sendeof()
    else:
        child.sendline(leave)
    assert finished(child) == 0


@pytest.mark.process
def test_unknown_characters_are_replaced_and_reported(rundir: RunDir) -> None:
    child = spawn(rundir)
    child.sendline("To bé")
    child.expect_exact("replaced: 'é'")
    child.expect_exact(REPLY)
    child.expect_exact(PROMPT)
    child.sendline("exit")
    assert finished(child) == 0
    assert transcript(rundir)[0]["replaced"] == ["é"]


class InterruptingTokenizer:
    """A stand-in tokenizer whose decoding is 'interrupted by Ctrl-C' at the fourth token."""

    eot_id = None
    vocab_size = 10
    chat = False

    def __init__(self) -> None:
        self.decoded = 0

    def encode_lossy(self, text: str) -> tuple[list[int], list[str]]:
        return [ord(c) % self.vocab_size for c in text], []

    def decode_bytes(self, ids: list[int]) -> bytes:
        self.decoded += 1
        if self.decoded == 4:
            raise KeyboardInterrupt
        return b"ab"


def test_ctrl_c_mid_reply_still_records_the_partial_reply(tmp_path: Path) -> None:
    model = GPT(GPTConfig(**TINY_MODEL, vocab_size=10)).eval()
    path = tmp_path / "transcript.jsonl"
    session = Session(model, InterruptingTokenizer(), SamplingConfig(), 0, path)
    chat = Chat(session, io.StringIO())
    with pytest.raises(KeyboardInterrupt):
        chat.reply("hello")
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert (line["reply"], line["reply_tokens"], line["stopped"]) == ("ababab", 3, "interrupted")


@pytest.mark.process
def test_idle_timeout_ends_the_session(rundir: RunDir) -> None:
    child = spawn(rundir, "--idle-timeout", "1")
    child.expect_exact("no input for 1 s")
    assert finished(child) == 0


@pytest.mark.process
def test_idle_terminal_redraws_the_prompt_for_someone_attaching_later(rundir: RunDir) -> None:
    # the redraw period is 10 s in production; shorten it for the test
    code = (
        "import sys, gpt.generation.repl, gpt.__main__; gpt.generation.repl.REDRAW_EVERY_S = 0.3; "
        "sys.exit(gpt.__main__.main(sys.argv[1:]))"
    )
    child = pexpect.spawn(
        sys.executable, ["-c", code, *args(rundir)[2:]], env=ENV, encoding="utf-8", timeout=TIMEOUT
    )
    child.expect_exact(PROMPT)
    for _ in range(2):
        child.expect_exact("\r" + PROMPT)
    child.sendline("To be")  # typing still works after redraws
    child.expect_exact(REPLY)
    child.expect_exact(PROMPT)
    child.sendeof()
    assert finished(child) == 0


@pytest.mark.process
def test_pipe_one_prompt_per_line(rundir: RunDir) -> None:
    stdin = "To be\n\n/top_k 3\n/help\n/nonsense\nor not\nquit\nnever read\n"
    out = subprocess.run(
        [sys.executable, *args(rundir, "--max_new_tokens", "9")],
        input=stdin, capture_output=True, text=True, env=ENV, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(REPLY) == 2
    assert f"{PROMPT}To be\n{REPLY}" in out.stdout  # piped prompts are echoed
    assert out.stdout.rstrip().endswith(GOODBYE)
    assert "/max_new_tokens N" in out.stdout and "unknown command /nonsense" in out.stdout
    lines = transcript(rundir)
    # top_k 0: no limit (the default), then /top_k 3
    assert [(t["prompt"], t["top_k"]) for t in lines] == [("To be", 0), ("or not", 3)]


@pytest.mark.process
def test_pipe_a_line_too_long_is_skipped_and_the_session_goes_on(rundir: RunDir) -> None:
    from gpt.generation.repl import MAX_LINE_CHARS

    endless = "x" * (3 * MAX_LINE_CHARS + 5)  # read in bounded pieces, never held whole
    stdin = f"{endless}\nTo be\n{'y' * MAX_LINE_CHARS}\nquit\n"
    out = subprocess.run(
        [sys.executable, *args(rundir, "--max_new_tokens", "3")],
        input=stdin, capture_output=True, text=True, env=ENV, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(f"line longer than {MAX_LINE_CHARS:,} characters: skipped") == 1
    assert "xxxxx" not in out.stdout and out.stdout.rstrip().endswith(GOODBYE)
    # The skipped line took nothing after it: the next prompt and a line of exactly the limit
    # are answered.
    assert [len(t["prompt"]) for t in transcript(rundir)] == [5, MAX_LINE_CHARS]


@pytest.mark.process
def test_pipe_end_of_input_ends_cleanly(rundir: RunDir) -> None:
    out = subprocess.run(
        [sys.executable, *args(rundir)], input="To be\n", capture_output=True, text=True,
        env=ENV, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(REPLY) == 1 and "end of input" in out.stdout


@pytest.mark.process
def test_pipe_idle_timeout_ends_a_session_nobody_feeds(rundir: RunDir) -> None:
    child = subprocess.Popen(
        [sys.executable, *args(rundir, "--idle_timeout", "1")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )
    try:
        child.wait(timeout=60)  # stdin stays open and silent (communicate() would close it)
    finally:
        child.kill()
    out = child.stdout.read()
    assert child.returncode == 0, child.stderr.read()
    assert "no input for 1 s" in out and out.rstrip().endswith(GOODBYE)


@pytest.mark.process
def test_prompt_flag_answers_each_and_replies_reproduce_from_the_transcript(rundir) -> None:
    out = one_shot(rundir, "--prompt", "To be", "--prompt", "ANTIPHOLUS:", "--seed", "5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(REPLY) == 2
    first, second = transcript(rundir)
    assert (first["seed"], second["seed"]) == (5, 6)  # one seed per reply
    # any transcript line is reproduced by its own seed and prompt
    again = one_shot(rundir, "--prompt", second["prompt"], "--seed", str(second["seed"]))
    assert again.returncode == 0, again.stderr
    assert transcript(rundir)[-1]["reply"] == second["reply"]


@pytest.mark.process
def test_gpt2_tokenizer_with_a_larger_model_vocabulary_streams_valid_text(root: Path) -> None:
    # compacted BPE (~300 ids) under a model of 512 ids: the spare ids must never be sampled,
    # and byte tokens that split a character must still stream as text
    rundir = export(root, GPT2Tokenizer.fit([TEXT + "héllo wörld ✓"]), vocab_size=512)
    out = one_shot(rundir, "--prompt", "wörld ✓", "--temperature", "2", "--max_new_tokens", "60")
    assert out.returncode == 0, out.stderr
    (line,) = transcript(rundir)
    assert line["replaced"] == [] and line["reply_tokens"] > 0


@pytest.mark.process
def test_no_model_says_to_train_first(root: Path) -> None:
    empty = RunDir.of(root, RUN)
    out = one_shot(empty, "--prompt", "x")
    assert out.returncode == 2
    assert "python -m gpt train-gpt" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not empty.transcript_jsonl.exists()


@pytest.mark.process
@pytest.mark.parametrize("payload", ["garbage", "pickle"])
def test_corrupt_or_pickled_model_is_refused(rundir: RunDir, payload: str, tmp_path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    data = pickle.dumps(Evil()) if payload == "pickle" else b"\x00not safetensors" * 8
    (rundir.model_dir / WEIGHTS).write_bytes(data)
    out = one_shot(rundir, "--prompt", "To be")
    assert out.returncode == 2
    assert "not a valid safetensors model" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not rundir.transcript_jsonl.exists()


@pytest.mark.process
def test_bad_setting_is_refused_naming_the_flag(rundir: RunDir) -> None:
    out = one_shot(rundir, "--top_p", "0", "--prompt", "To be")
    assert out.returncode == 2 and "--top_p" in out.stderr
