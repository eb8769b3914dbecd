"""The interactive prompt: read a line, stream the model's reply, repeat.

Text lives here; the engine (`gpt.generation.sampling`) knows only token ids. The same loop serves a
person at a terminal (readline editing and history), a pipe (one prompt per line) and a person who
attaches to the pod's terminal later (`kubectl attach -it`): the prompt is flushed, printed again
on an empty line, and re-drawn every few seconds while nobody types.

Ctrl-C stops a reply, or clears the line being typed, and the session goes on, as in Python's
own REPL: attached to the prompt pod, ending the session would end the pod and its pipeline
step, and nobody could attach again. exit, quit, Ctrl-D, the idle timeout or SIGTERM end it.
"""

from __future__ import annotations

import codecs
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from gpt.config.configs import SamplingConfig
from gpt.generation.sampling import generate, new_generator
from gpt.models.model import GPT
from gpt.rundir import atomic
from gpt.tokenizer.kinds import Tokenizer

PROMPT = "GPT prompt > "
REPLY = "GPT replying > "
NOTE = "GPT note > "
GOODBYE = "Goodbye."
EXIT_WORDS = ("exit", "quit")
HOW_TO_LEAVE = "Ctrl-C does not end the session: type exit or press Ctrl-D to leave"
# How often an idle terminal re-draws the prompt, so someone who attaches sees it within this long.
REDRAW_EVERY_S = 10.0
# The longest piped line read as a prompt; a longer one is skipped whole. The model sees at most
# block_size tokens of a prompt anyway, and a line without end must not fill the memory.
MAX_LINE_CHARS = 65536

HELP = """\
Type a prompt and press Enter; the model continues the text.
Settings (with no value: show it):
  /temperature X      0 = greedy, higher = more adventurous
  /top_k N | off      sample among the N most likely tokens only
  /top_p P            sample among the most likely tokens adding up to P, in (0, 1]
  /max_new_tokens N   longest reply, in tokens
  /seed N             seed of the next reply (each reply after it uses the next number)
  /settings           show all settings
  /help               this text
Ctrl-C stops a reply; exit, quit or Ctrl-D end the session."""


class IdleTimeout(Exception):
    """Nobody typed anything for --idle-timeout seconds."""


class LineTooLong(Exception):
    """A piped line longer than MAX_LINE_CHARS; it was read to its end and dropped."""


def _top_k(text: str) -> int:
    return 0 if text.lower() in ("off", "none") else int(text)


# setting -> parser of its value; dataclasses.replace re-validates the SamplingConfig
SETTINGS = {"temperature": float, "top_k": _top_k, "top_p": float, "max_new_tokens": int}


class _Streamed:
    """A reply as it streams: its text so far and its tokens. Byte-level BPE tokens can split a
    UTF-8 character, so the text is decoded from their bytes incrementally."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pieces: list[str] = []
        self.tokens = 0
        self.interrupted = True
        """Until the reply ends by itself (end of text or max_new_tokens), not by Ctrl-C."""

    def add(self, data: bytes) -> str:
        """The text of a token's bytes `data` that is whole now (possibly none)."""
        self.pieces.append(self.decoder.decode(data))
        return self.pieces[-1]

    def end(self) -> str:
        """The text of bytes left over at the end (a cut character decodes as U+FFFD)."""
        self.pieces.append(self.decoder.decode(b"", final=True))
        return self.pieces[-1]

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class Chat:
    """A model, its tokenizer and the current settings; answers prompts and logs them."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        settings: SamplingConfig,
        seed: int,
        transcript: Path,
        out: TextIO,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.seed = seed  # the next reply's seed: every reply can be reproduced on its own
        self.transcript = transcript
        self.out = out

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def reply(self, text: str) -> None:
        """Stream the model's continuation of `text` and append both to the transcript."""
        prompt = self._prompt_ids(text)
        if prompt is None:
            return
        ids, replaced = prompt
        seed, settings = self.seed, self.settings
        self.seed += 1
        generator = new_generator(seed, self.model.lm_head.weight.device)
        streamed, t0 = _Streamed(), time.perf_counter()
        self.out.write(REPLY)
        self.out.flush()
        try:
            for token in generate(
                self.model,
                ids,
                settings,
                generator,
                eot_id=self.tokenizer.eot_id,
                vocab_size=self.tokenizer.vocab_size,
            ):
                self.out.write(streamed.add(self.tokenizer.decode_bytes([token])))
                self.out.flush()
                streamed.tokens += 1
            streamed.interrupted = False
        finally:  # Ctrl-C mid-reply still records what was said
            self.say(streamed.end())
            self._record(text, prompt, streamed, seed, settings, time.perf_counter() - t0)

    def _prompt_ids(self, text: str) -> tuple[list[int], list[str]] | None:
        """`text`'s token ids (an empty prompt: the end of text, a fresh document) and the
        characters the tokenizer replaced; None, once it has said why, if nothing is left."""
        ids, replaced = self.tokenizer.encode_lossy(text)
        if replaced:
            shown = " ".join(repr(c) for c in dict.fromkeys(replaced))
            self.say(f"{NOTE}not in the tokenizer's vocabulary, replaced: {shown}")
        if not ids:
            if self.tokenizer.eot_id is None:
                self.say(f"{NOTE}nothing left of that prompt to continue; try other words")
                return None
            ids = [self.tokenizer.eot_id]  # start of a fresh document: unconditional text
        block_size = self.model.config.block_size
        if len(ids) > block_size:
            self.say(f"{NOTE}prompt is {len(ids)} tokens; the model sees the last {block_size}")
        return ids, replaced

    def _record(self, text: str, prompt: tuple[list[int], list[str]], streamed: _Streamed,
                seed: int, settings: SamplingConfig, seconds: float) -> None:
        """Append a reply to the transcript: the prompt `text` (its ids and replaced characters
        `prompt`), what was `streamed`, and what made it."""
        ids, replaced = prompt
        atomic.append_jsonl(
            self.transcript,
            {
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "prompt": text,
                "reply": streamed.text,
                "replaced": replaced,
                "prompt_tokens": len(ids),
                "reply_tokens": streamed.tokens,
                "stopped": "interrupted" if streamed.interrupted
                else "max_new_tokens" if streamed.tokens == settings.max_new_tokens
                else "end_of_text",
                "seconds": round(seconds, 3),
                "seed": seed,
                **dataclasses.asdict(settings),
            },
            what="the transcript",
        )

    def command(self, line: str) -> None:
        """Handle a `/name [value]` line: change or show a setting, or print help."""
        name, _, value = line[1:].strip().partition(" ")
        value = value.strip()
        if name == "help":
            self.say(HELP)
        elif name == "settings":
            self.say(self.describe())
        elif name == "seed":
            if value:
                try:
                    self.seed = int(value)
                except ValueError:
                    self.say(f"{NOTE}/seed {value!r}: not an integer")
                    return
            self.say(f"{NOTE}seed {self.seed}")
        elif name in SETTINGS:
            if value:
                try:
                    parsed = SETTINGS[name](value)
                    self.settings = dataclasses.replace(self.settings, **{name: parsed})
                except ValueError as e:
                    self.say(f"{NOTE}/{name} {value!r}: {str(e).split(': ', 1)[-1]}")
                    return
            self.say(f"{NOTE}{name} {getattr(self.settings, name)}")
        else:
            self.say(f"{NOTE}unknown command /{name}; /help lists them")

    def describe(self) -> str:
        values = {**dataclasses.asdict(self.settings), "seed": self.seed}
        return NOTE + ", ".join(f"{k} {v}" for k, v in values.items())


def _read_line(out: TextIO, typed: Callable[[], str] | None, deadline: float | None) -> str:
    """`input(PROMPT)`, with IdleTimeout raised at `deadline` (time.monotonic()) and, on a
    terminal (`typed` gives readline's current line), the prompt re-drawn every REDRAW_EVERY_S
    while nothing is typed.

    A SIGALRM handler does both: it runs inside readline's wait and an exception it raises ends
    input(), for a terminal and a pipe alike. Signals work on the main thread only.
    """
    read = input if typed is not None else _read_piped
    if typed is None and deadline is None:
        return read(PROMPT)

    def arm() -> None:
        delay = REDRAW_EVERY_S if typed is not None else float("inf")
        if deadline is not None:
            delay = min(delay, deadline - time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, max(delay, 0.001))

    def on_alarm(signum, frame) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise IdleTimeout
        if typed is not None and not typed():
            out.write("\r" + PROMPT)  # same place, same text: invisible unless you just attached
            out.flush()
        arm()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    arm()
    try:
        return read(PROMPT)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _read_piped(prompt: str) -> str:
    """input() for a pipe, reading at most MAX_LINE_CHARS at a time: the line without its end,
    EOFError at the end of input, LineTooLong (after reading past it) for a longer line."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = sys.stdin.readline(MAX_LINE_CHARS + 1)
    if not line:
        raise EOFError
    if len(line) <= MAX_LINE_CHARS or line.endswith("\n"):
        return line.removesuffix("\n")
    while (rest := sys.stdin.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
        pass
    raise LineTooLong


def interact(chat: Chat, idle_timeout: float) -> None:
    """Answer prompts from stdin until exit/quit, EOF or idle_timeout seconds of silence; Ctrl-C
    stops a reply or clears the line, and asks again."""
    terminal = sys.stdin.isatty() and chat.out.isatty()  # what makes input() use readline
    typed = None
    if terminal:
        import readline  # importing it gives input() line editing and history

        typed = readline.get_line_buffer
    reason = ""
    try:
        while True:
            deadline = time.monotonic() + idle_timeout if idle_timeout else None  # 0: never
            try:
                line = _read_line(chat.out, typed, deadline)
            except LineTooLong:
                chat.say(f"\n{NOTE}line longer than {MAX_LINE_CHARS:,} characters: skipped")
                continue
            except KeyboardInterrupt:  # readline dropped the line; say how to leave instead
                chat.say(f"\n{NOTE}{HOW_TO_LEAVE}")
                continue
            if not terminal:
                chat.say(line)  # echo piped input so the output reads as a conversation
            line = line.strip()
            if not line:
                continue  # input() prints the prompt again: what someone who just attached needs
            if line.lower() in EXIT_WORDS:
                break
            if line.startswith("/"):
                chat.command(line)
                continue
            try:
                chat.reply(line)
            except KeyboardInterrupt:  # the transcript has the reply so far, marked interrupted
                chat.say(f"{NOTE}reply interrupted")
    except EOFError:
        reason = "end of input"
    except IdleTimeout:
        reason = f"no input for {idle_timeout:g} s"
    if reason:
        chat.say(f"\n{NOTE}{reason}")
    chat.say(GOODBYE)
