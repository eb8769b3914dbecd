"""One person talking to the model: the settings, the next seed, the transcript, and with a chat
model the conversation so far. Its replies stream as text; the terminal (repl.py) and the chat
page (chat_page.py) show them.

A text model continues each prompt on its own, as nanoGPT's sample.py does. A chat model
(`tokenizer.chat`) answers in turns: the prompt is the conversation rendered in its chat format
(conversation.py) and the reply ends where the model ends its turn (`<|im_end|>`), the ids the
export's generation_config.json ends a reply at. Every reply, stopped by Ctrl-C or a closed
page too, is appended to the transcript with what made it, so any reply can be reproduced alone.
"""

from __future__ import annotations

import codecs
import dataclasses
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpt.config.configs import SamplingConfig
from gpt.generation.conversation import Conversation, TooLong, reply_room
from gpt.generation.sampling import generate, new_generator
from gpt.models.export import eos_ids
from gpt.models.model import GPT
from gpt.rundir import atomic
from gpt.tokenizer.chat import Malformed
from gpt.tokenizer.kinds import Tokenizer


class Refused(ValueError):
    """A message the model is not asked to answer; the message says why, for the person."""


@dataclass
class Prepared:
    """A message ready for a reply: the ids the model reads and what to tell the person first."""

    text: str
    ids: list[int]
    notes: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    """Characters the tokenizer lacks, replaced (a character tokenizer's only)."""
    dropped: int = 0
    """Turns at the start of the conversation the model does not see (a chat model's)."""


class _Streamed:
    """A reply as it streams: its text so far and its tokens. Byte-level BPE tokens can split a
    UTF-8 character, so the text is decoded from their bytes incrementally."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pieces: list[str] = []
        self.tokens = 0
        self.interrupted = True
        """Until the reply ends by itself (its end, or max_new_tokens), not by Ctrl-C."""

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


class Session:
    """A model, its tokenizer, the current settings and seed; with a chat model, the turns."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, settings: SamplingConfig, seed: int,
                 transcript: Path, system: str = "") -> None:  # fmt: skip
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.seed = seed  # the next reply's seed: every reply can be reproduced on its own
        self.transcript = transcript
        stop = eos_ids(tokenizer)
        self.stop_ids = frozenset([] if stop is None else [stop] if isinstance(stop, int) else stop)
        self.conversation: Conversation | None = None
        self.conversation_id = ""
        self.last_stopped = ""
        """Why the last reply stopped, as the transcript says it."""
        if tokenizer.chat:
            self.conversation = Conversation(tokenizer)  # type: ignore[arg-type]
            self.set_system(system)
            self.reset()
        elif system:
            raise Refused("a text model continues text; a system prompt needs a chat model "
                          "(load-corpus --chat true)")

    @property
    def chat(self) -> bool:
        return self.conversation is not None

    def reset(self) -> None:
        """A new conversation: no turns, the same system prompt, a new id in the transcript."""
        if self.conversation is None:
            raise Refused("a text model answers each prompt on its own: nothing to reset")
        self.conversation.reset()
        self.conversation_id = uuid.uuid4().hex[:12]

    def set_system(self, text: str) -> None:
        """The system prompt of the next replies; "" for none."""
        if self.conversation is None:
            raise Refused("a text model continues text; a system prompt needs a chat model")
        try:
            self.conversation.set_system(text)
        except Malformed as e:
            raise Refused(f"the system prompt {e}") from None

    def prepare(self, text: str) -> Prepared:
        """The ids for a reply to `text`, with what to tell the person; Refused if none."""
        block_size = self.model.config.block_size
        if self.conversation is not None:
            room = reply_room(block_size, self.settings.max_new_tokens)
            try:
                prompt = self.conversation.prompt(text, block_size, room)
            except Malformed as e:
                raise Refused(f"your message {e}; not sent") from None
            except TooLong as e:
                raise Refused(str(e)) from None
            notes = [f"the model no longer sees the first {prompt.dropped} turn(s) of this "
                     "conversation; /reset starts over"] if prompt.dropped else []  # fmt: skip
            return Prepared(text, prompt.ids, notes, dropped=prompt.dropped)
        ids, replaced = self.tokenizer.encode_lossy(text)
        notes = []
        if replaced:
            shown = " ".join(repr(c) for c in dict.fromkeys(replaced))
            notes.append(f"not in the tokenizer's vocabulary, replaced: {shown}")
        if not ids:
            if self.tokenizer.eot_id is None:
                raise Refused("nothing left of that prompt to continue; try other words")
            ids = [self.tokenizer.eot_id]  # start of a fresh document: unconditional text
        if len(ids) > block_size:
            notes.append(f"prompt is {len(ids)} tokens; the model sees the last {block_size}")
        return Prepared(text, ids, notes, replaced)

    def stream(self, prepared: Prepared) -> Iterator[str]:
        """The reply's text, piece by piece, as it is sampled. However it ends (its end,
        max_new_tokens, an exception, or the caller closing the iterator), the reply joins the
        conversation and the transcript."""
        seed, settings = self.seed, self.settings
        self.seed += 1
        generator = new_generator(seed, self.model.lm_head.weight.device)
        streamed, t0 = _Streamed(), time.perf_counter()
        try:
            for token in generate(self.model, prepared.ids, settings, generator,
                                  stop_ids=self.stop_ids, vocab_size=self.tokenizer.vocab_size):
                piece = streamed.add(self.tokenizer.decode_bytes([token]))
                streamed.tokens += 1
                if piece:
                    yield piece
            streamed.interrupted = False
            if tail := streamed.end():
                yield tail
        finally:  # a stopped reply still records what was said
            if streamed.interrupted:
                streamed.end()
            self._record(prepared, streamed, seed, settings, time.perf_counter() - t0)

    def _record(self, prepared: Prepared, streamed: _Streamed, seed: int,
                settings: SamplingConfig, seconds: float) -> None:  # fmt: skip
        """Add a reply to the conversation and append it to the transcript: what was asked,
        what was `streamed`, and what made it."""
        turns = {}
        if self.conversation is not None:
            self.conversation.add(prepared.text, streamed.text)
            turns = {"conversation": self.conversation_id,
                     "messages": self.conversation.messages(), "dropped_turns": prepared.dropped}
        ended = "end_of_turn" if self.chat else "end_of_text"
        self.last_stopped = ("interrupted" if streamed.interrupted
                             else "max_new_tokens" if streamed.tokens == settings.max_new_tokens
                             else ended)  # fmt: skip
        atomic.append_jsonl(
            self.transcript,
            {
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "prompt": prepared.text,
                "reply": streamed.text,
                **turns,
                "replaced": prepared.replaced,
                "prompt_tokens": len(prepared.ids),
                "reply_tokens": streamed.tokens,
                "stopped": self.last_stopped,
                "seconds": round(seconds, 3),
                "seed": seed,
                **dataclasses.asdict(settings),
            },
            what="the transcript",
        )
