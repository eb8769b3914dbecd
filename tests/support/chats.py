"""Chat runs for tests: conversations of every shape load-corpus meets, and a tiny chat model
trained on them, made once per test session (made_once) for the prompt stage's tests, the chat
page's and KServe's round trip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpt.rundir.layout import RunDir
from support.once import made_once
from support.runs import TINY, as_flags, in_process

BLOCK = 48  # rows of 49 tokens: several short conversations share one, a long one is cut
WORDS = "the ship sails at dawn and every merchant of Ephesus pays a thousand marks to stay".split()
SYSTEM = "Answer in one line."
# Long enough that the tiny model learns to end its turns (a greedy reply to a conversation like
# the data's ends at <|im_end|> within a dozen tokens)
TRAINED = {**TINY, "block_size": BLOCK, "max_iters": 150, "eval_interval": 150}


def conversations() -> list[dict]:
    """Short and long conversations, with and without a system prompt, one of several turns
    that must be cut, one whose first reply cannot fit (skipped), one null."""
    out = []
    for i in range(30):
        words = WORDS[i % 7 : i % 7 + 2 + i % 5]
        messages = [{"role": "system", "content": SYSTEM}] if i % 4 == 0 else []
        messages += [{"role": "user", "content": f"Where is {' '.join(words)}?"},
                     {"role": "assistant", "content": f"{words[-1].title()} is here, {i}."}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "And then?"},
                         {"role": "assistant", "content": " Then — é — we go."}]
        out.append({"messages": messages})
    out[5]["messages"] += [{"role": "user", "content": " ".join(WORDS)},
                           {"role": "assistant", "content": " ".join(WORDS)}] * 2  # cut
    out.insert(7, {"messages": [{"role": "user", "content": "Say it all."},
                                {"role": "assistant", "content": " ".join(WORDS * 3)}]})
    out.insert(9, {"messages": None})
    return out


def load_chat_corpus(root: Path, run: str) -> RunDir:
    """load-corpus --chat true on conversations(), rows of BLOCK."""
    source = root / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in conversations()))
    assert in_process("load-corpus", "--root", str(root), "--run", run, "--source",
                      str(source), "--chat", "true", "--block_size", str(BLOCK)) == 0
    return RunDir.of(root, run)


def trained_chat_run(tmp_path_factory: pytest.TempPathFactory, root: Path) -> RunDir:
    """A copy under `root` of the chat run trained TRAINED's iterations on conversations()
    (made once per session): data/, ckpt/ and model/, no transcript yet."""

    def make(folder: Path) -> None:
        load_chat_corpus(folder, "chat")
        assert in_process("train-gpt", "--root", str(folder), "--run", "chat",
                          *as_flags(TRAINED)) == 0  # fmt: skip

    made = made_once(tmp_path_factory, "trained-chat", make)
    shutil.copytree(made / "chat", root / "chat")
    return RunDir.of(root, "chat")
