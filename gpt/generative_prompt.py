"""generative-prompt: load the exported model and answer prompts.

`python -m gpt generative-prompt --root R --run ID` opens the interactive prompt (a terminal, a
pipe, or a pod's terminal reached with `kubectl attach -it`); `--prompt TEXT` (repeatable)
answers those and exits. A chat model (trained on load-corpus --chat data) holds a conversation:
each prompt is the user's next turn, after `--system`'s prompt. Every prompt and reply is
appended to `prompt/transcript.jsonl`. `--web_port PORT` serves a chat page on localhost:PORT
instead of the terminal (gpt/generation/chat_page.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from gpt.config.configs import PromptConfig
from gpt.errors import InputError
from gpt.generation.chat_page import ChatServer, serve
from gpt.generation.repl import GOODBYE, NOTE, PROMPT, Chat, interact
from gpt.generation.session import Refused, Session
from gpt.models.export import finetuned_from, load_export


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device here (try --device cpu)")
    return device


def main(cfg: PromptConfig) -> None:
    rundir = cfg.rundir
    device = resolve_device(cfg.device)
    model, tokenizer = load_export(rundir.model_dir, device=device)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise InputError(
            f"{rundir.model_dir}: tokenizer has {tokenizer.vocab_size} tokens but the model "
            f"only {model.config.vocab_size}; re-export it with `python -m gpt train-gpt`"
        )

    def new_session(system: str) -> Session:
        return Session(model, tokenizer, cfg.sampling, cfg.seed, rundir.transcript_jsonl, system)

    try:
        session = new_session(cfg.system)
    except Refused as e:
        raise InputError(f"--system: {e}") from None
    tuned = finetuned_from(rundir.model_dir)
    described = (f"{model.describe()}; {tokenizer.name} tokenizer"
                 f"{f'; fine-tuned from {tuned}' if tuned else ''}"
                 f"{'; a chat model: replies in turns' if session.chat else ''}")  # fmt: skip
    print(f"generative-prompt: model from {rundir.model_dir} ({described}) on {device}; "
          f"transcript: {rundir.transcript_jsonl}", file=sys.stderr)  # fmt: skip
    if cfg.web_port:
        serve_page(cfg, new_session, {"model": described, "chat": session.chat,
                                      "system": cfg.system})  # fmt: skip
        return
    chat = Chat(session, sys.stdout)
    if cfg.prompt:
        try:
            for text in cfg.prompt:
                chat.say(PROMPT + text)
                chat.reply(text)
        except KeyboardInterrupt:  # a clean end, as in the interactive session
            chat.say(GOODBYE)
        return
    print("Type a prompt; /help for settings; exit, quit or Ctrl-D to leave.", file=sys.stderr)
    interact(chat, cfg.idle_timeout)


def serve_page(cfg: PromptConfig, new_session: Callable[[str], Session],
               info: dict[str, Any]) -> None:  # fmt: skip
    """The chat page on localhost:--web_port until Ctrl-C or --idle_timeout."""
    try:
        server = ChatServer(cfg.web_port, new_session, info)
    except OSError as e:
        raise InputError(f"--web_port {cfg.web_port}: cannot listen there: "
                         f"{e.strerror or e}") from None
    reason = serve(server, cfg.idle_timeout, lambda line: print(line, file=sys.stderr))
    print(f"{NOTE}{reason}\n{GOODBYE}", file=sys.stderr)
