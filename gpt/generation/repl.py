"""The interactive prompt: read a line, stream the model's reply, repeat.

The terminal lives here; the replies and the conversation in session.py, and the engine
(`gpt.generation.sampling`) knows only token ids. The same loop serves a
person at a terminal (readline editing and history), a pipe (one prompt per line) and a person who
attaches to the pod's terminal later (`kubectl attach -it`): the prompt is flushed, printed again
on an empty line, and re-drawn every few seconds while nobody types.

Ctrl-C stops a reply, or clears the line being typed, and the session goes on, as in Python's
own REPL: attached to the prompt pod, ending the session would end the pod and its pipeline
step, and nobody could attach again. exit, quit, Ctrl-D, the idle timeout or SIGTERM end it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from gpt.generation.session import Refused, Session

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

# A chat model's: the same settings, and the conversation's own commands.
CHAT_HELP = HELP.replace(
    "Type a prompt and press Enter; the model continues the text.",
    "Type a message and press Enter; the model replies, and remembers the conversation\n"
    "(the oldest turns leave its view when the context is full).",
).replace(
    "  /settings ",
    "  /system TEXT | off  the system prompt of the next replies (no value: show it)\n"
    "  /reset              start a new conversation (the system prompt stays)\n"
    "  /settings ",
)


class IdleTimeout(Exception):
    """Nobody typed anything for --idle-timeout seconds."""


class LineTooLong(Exception):
    """A piped line longer than MAX_LINE_CHARS; it was read to its end and dropped."""


def _top_k(text: str) -> int:
    return 0 if text.lower() in ("off", "none") else int(text)


# setting -> parser of its value; dataclasses.replace re-validates the SamplingConfig
SETTINGS = {"temperature": float, "top_k": _top_k, "top_p": float, "max_new_tokens": int}


class Chat:
    """The terminal's side of a Session: prints its replies as they stream, its notes, and
    handles the `/` commands."""

    def __init__(self, session: Session, out: TextIO) -> None:
        self.session = session
        self.out = out

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def reply(self, text: str) -> None:
        """Stream the model's reply to `text` (the transcript records it, stopped or not)."""
        try:
            prepared = self.session.prepare(text)
        except Refused as e:
            self.say(f"{NOTE}{e}")
            return
        for note in prepared.notes:
            self.say(NOTE + note)
        self.out.write(REPLY)
        self.out.flush()
        # closing() ends the stream (and records the reply) even where Ctrl-C lands between
        # two pieces, outside the generator
        with contextlib.closing(self.session.stream(prepared)) as pieces:
            try:
                for piece in pieces:
                    self.out.write(piece)
                    self.out.flush()
            finally:
                self.say("")

    def command(self, line: str) -> None:
        """Handle a `/name [value]` line: change or show a setting, or print help."""
        name, _, value = line[1:].strip().partition(" ")
        value = value.strip()
        session = self.session
        if name == "help":
            self.say(CHAT_HELP if session.chat else HELP)
        elif name == "settings":
            self.say(self.describe())
        elif name in ("system", "reset"):
            self._turns_command(name, value)
        elif name == "seed":
            if value:
                try:
                    session.seed = int(value)
                except ValueError:
                    self.say(f"{NOTE}/seed {value!r}: not an integer")
                    return
            self.say(f"{NOTE}seed {session.seed}")
        elif name in SETTINGS:
            if value:
                try:
                    parsed = SETTINGS[name](value)
                    session.settings = dataclasses.replace(session.settings, **{name: parsed})
                except ValueError as e:
                    self.say(f"{NOTE}/{name} {value!r}: {str(e).split(': ', 1)[-1]}")
                    return
            self.say(f"{NOTE}{name} {getattr(session.settings, name)}")
        else:
            self.say(f"{NOTE}unknown command /{name}; /help lists them")

    def _turns_command(self, name: str, value: str) -> None:
        """/reset, /system (show it), /system off, /system TEXT."""
        session = self.session
        try:
            if name == "reset":
                session.reset()
                self.say(f"{NOTE}a new conversation; the model forgets the turns before")
            elif value.lower() in ("off", "none"):
                session.set_system("")
                self.say(f"{NOTE}no system prompt")
            elif value:
                session.set_system(value)
                self.say(f"{NOTE}system prompt set for the next replies")
            else:
                shown = session.conversation.system if session.conversation else ""
                self.say(f"{NOTE}system prompt: {shown!r}" if shown else f"{NOTE}no system prompt")
        except Refused as e:
            self.say(f"{NOTE}/{name}: {e}")

    def describe(self) -> str:
        values = {**dataclasses.asdict(self.session.settings), "seed": self.session.seed}
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
