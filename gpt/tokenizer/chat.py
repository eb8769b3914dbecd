"""The chat format: a conversation (`messages`, each a `role` and its `content`) as token ids,
and which of them the loss counts.

The format is ChatML's, as Qwen's and SmolLM's tokenizers render it, and `TEMPLATE` is its
Jinja form, the `chat_template` of the export's tokenizer_config.json (the Hugging Face
convention, which `apply_chat_template`, vLLM and KServe's Hugging Face server render):

    <|im_start|>system\\n{content}<|im_end|>\\n<|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<|im_end|>\\n

The two markers are special tokens of the tokenizer (gpt/tokenizer/kinds.py appends them after
its vocabulary), never text: a content spelling one (or end-of-text) is refused, since a server
would read it as the marker. A rendering is encoded as transformers encodes the rendered string:
the markers split it, and each piece between them is BPE-encoded whole. The loss counts the
assistant's content and the `<|im_end|>` that ends its turn, which is how a reply learns to
stop; never the markers and roles around it, nor the system's and user's turns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tiktoken

from gpt.tokenizer.ranks import ENDOFTEXT

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
MARKERS = (IM_START, IM_END)  # appended to a chat tokenizer's vocabulary, in this order
ROLES = ("system", "user", "assistant")
# What a content may not spell: a server would read each as the token, not as text
SPECIALS = (ENDOFTEXT, *MARKERS)

TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def header(role: str) -> str:
    """The text between a turn's `<|im_start|>` and its content."""
    return f"{role}\n"


class Malformed(ValueError):
    """A conversation the format cannot hold; its message says why (the caller names the
    record)."""


def spelled_special(content: str) -> str | None:
    """The first of SPECIALS that `content` spells, if any."""
    return next((s for s in SPECIALS if s in content), None)


def check(messages: object) -> list[tuple[str, str]]:
    """The (role, content) turns of a record's `messages`, or Malformed: not a list of objects
    with a known role and a string content, no assistant turn, a content spelling one of
    SPECIALS."""
    if not isinstance(messages, list) or not messages:
        raise Malformed(f"'messages' is {_what(messages)}, not a non-empty array of messages")
    turns = []
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise Malformed(f"message {n} is {_what(message)}, not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise Malformed(f"message {n}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise Malformed(f"message {n} ({role}): content is {_what(content)}, not a string")
        if spelled := spelled_special(content):
            raise Malformed(f"message {n} ({role}): its content spells the token {spelled!r}")
        turns.append((role, content))
    if not any(role == "assistant" for role, _ in turns):
        raise Malformed("no assistant turn: nothing to train on")
    return turns


def _what(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


@dataclass(frozen=True)
class Rendered:
    """A conversation as ids, `counted` (uint8, 1 where the loss counts the id as a target), and
    whether it was cut short to fit."""

    ids: np.ndarray
    counted: np.ndarray
    cut: bool


class Renderer:
    """Renders conversations with a tokenizer's BPE (a tiktoken Encoding holding the markers as
    special tokens)."""

    def __init__(self, bpe: tiktoken.Encoding) -> None:
        self.bpe = bpe
        self.start, self.end = (bpe.encode_single_token(m) for m in MARKERS)
        self.lengths = token_lengths(bpe)
        self.newline = bpe.encode_ordinary("\n")  # after <|im_end|>: a piece of its own

    def turn(self, role: str, content: str) -> tuple[np.ndarray, np.ndarray]:
        """One turn's ids and their counted flags. The header and the content are one piece of
        BPE (as transformers encodes it), so a token may span both: it is counted where it holds
        content's bytes."""
        ids = self.bpe.encode_to_numpy(header(role) + content, disallowed_special=())
        out = np.concatenate([[self.start], ids, [self.end], self.newline]).astype(np.int64)
        counted = np.zeros(len(out), dtype=np.uint8)
        if role == "assistant":
            ends = np.cumsum(self.lengths[ids])
            counted[1 : len(ids) + 1] = ends > len(header(role).encode())
            counted[len(ids) + 1] = 1  # <|im_end|>: where a reply stops
        return out, counted

    def reply_prefix(self) -> np.ndarray:
        """What a reply starts from (the template's `add_generation_prompt`): the assistant's
        header, its own piece of BPE."""
        ids = self.bpe.encode_ordinary(header("assistant"))
        return np.array([self.start, *ids], dtype=np.int64)

    def render(self, turns: list[tuple[str, str]], limit: int) -> Rendered | None:
        """The conversation's ids, cut after the last assistant turn that ends within `limit`
        ids (a turn is never split); None where even the first assistant turn does not."""
        ids, counted, length, kept = [], [], 0, 0
        for role, content in turns:
            turn_ids, turn_counted = self.turn(role, content)
            length += len(turn_ids)
            if length > limit:
                break
            ids.append(turn_ids)
            counted.append(turn_counted)
            if role == "assistant":
                kept = len(ids)
        if not kept:
            return None
        return Rendered(np.concatenate(ids[:kept]), np.concatenate(counted[:kept]),
                        cut=kept < len(turns))


@functools.cache
def token_lengths(bpe: tiktoken.Encoding) -> np.ndarray:
    """Bytes per id of `bpe` (a special token's: its spelling's)."""
    return np.array([len(bpe.decode_single_token_bytes(i)) for i in range(bpe.n_vocab)],
                    dtype=np.int64)
