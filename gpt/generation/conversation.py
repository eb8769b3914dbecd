"""A chat model's conversation: the system prompt and the turns so far, as the ids the model
reads before its next reply.

The turns are rendered in the chat format the model trained on (gpt/tokenizer/chat.py), so the
prompt is what `apply_chat_template(messages, add_generation_prompt=True)` gives a server of the
export. The context window holds the newest turns only: the oldest exchanges (a user's turn and
the reply to it) are dropped whole, never cut mid-turn, and the system prompt always stays, as
chat servers keep it. The full conversation is kept for the transcript and the download.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpt.tokenizer.chat import Malformed, Renderer, spelled_special
from gpt.tokenizer.kinds import GPT2Tokenizer


def reply_room(block_size: int, max_new_tokens: int) -> int:
    """The ids of the window kept free for a reply: its longest, at most half the window (a
    long reply slides the window as a text model's does, rather than leaving no history)."""
    return min(max_new_tokens, block_size // 2)


class TooLong(ValueError):
    """The newest message (with the system prompt) leaves no room for a reply; the message says
    how long it is and what fits."""


@dataclass(frozen=True)
class Prompt:
    """The ids the model reads before a reply, and how many of the earliest turns (besides the
    system prompt) it does not see."""

    ids: list[int]
    dropped: int


class Conversation:
    """The turns of one conversation with a chat model (`tokenizer.chat`), `system` first."""

    def __init__(self, tokenizer: GPT2Tokenizer, system: str = "") -> None:
        self.renderer = Renderer(tokenizer.bpe)
        self.turns: list[tuple[str, str]] = []  # (role, content): user and assistant in turn
        self.system = ""
        self.set_system(system)  # Malformed if it spells a marker

    def set_system(self, text: str) -> None:
        """The system prompt of the next replies ("" for none); Malformed if it spells a turn
        marker."""
        _refuse_specials(text)
        self.system = text

    def reset(self) -> None:
        """Start over: no turns; the system prompt stays."""
        self.turns.clear()

    def messages(self) -> list[dict[str, str]]:
        """The conversation in the `messages` format (load-corpus --chat reads it back)."""
        head = [("system", self.system)] if self.system else []
        return [{"role": role, "content": content} for role, content in head + self.turns]

    def prompt(self, user: str, block_size: int, room: int) -> Prompt:
        """The ids for a reply to `user` after the turns so far, within `block_size - room`
        ids. Malformed if `user` spells a marker; TooLong if it does not fit even alone."""
        _refuse_specials(user)
        budget = block_size - room
        head = [self.renderer.turn("system", self.system)[0]] if self.system else []
        newest = [self.renderer.turn("user", user)[0], self.renderer.reply_prefix()]
        used = sum(len(ids) for ids in head + newest)
        if used > budget:
            raise TooLong(f"the message is {used} tokens with the system prompt and the reply's "
                          f"start; the model reads {budget} before a reply of up to {room}: "
                          "shorten it")
        history: list[np.ndarray] = []
        kept = 0  # turns, counted from the newest back in whole exchanges
        for start in range(len(self.turns) - 2, -1, -2):
            exchange = [self.renderer.turn(role, content)[0]
                        for role, content in self.turns[start : start + 2]]  # fmt: skip
            size = sum(len(ids) for ids in exchange)
            if used + size > budget:
                break
            history[:0] = exchange
            used += size
            kept += 2
        ids = np.concatenate([*head, *history, *newest])
        return Prompt(ids.tolist(), dropped=len(self.turns) - kept)

    def add(self, user: str, reply: str) -> None:
        """Record an exchange: the user's turn and the reply the model gave."""
        self.turns += [("user", user), ("assistant", reply)]


def _refuse_specials(content: str) -> None:
    """Malformed, saying which, if `content` spells a special token (the chat format's own
    refusal, which load-corpus makes too: a server would read it as the token)."""
    if spelled := spelled_special(content):
        raise Malformed(f"spells the token {spelled!r}")
