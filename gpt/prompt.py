"""generative-prompt: load the exported model and answer prompts.

`python -m gpt prompt --root R --run ID` opens the interactive prompt (a terminal, a pipe, or a
pod's terminal reached with `kubectl attach -it`); `--prompt TEXT` (repeatable) answers those and
exits. Every prompt and reply is appended to `prompt/transcript.jsonl`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from gpt.config import RunConfig, SamplingConfig, fields_of
from gpt.errors import InputError

# The module's top level imports no PyTorch: the pipeline's component image (which has none)
# imports PromptConfig to check a step's flags before it creates a TrainJob.
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@dataclass
class PromptConfig(SamplingConfig, RunConfig):
    """The prompt stage's flags: the run directory, the sampling settings, and these."""

    seed: int = 1337
    """Seed of the first reply's sampling; each later reply uses the next number, so any
    transcript line can be reproduced with --seed and --prompt."""
    prompt: list[str] = field(default_factory=list)
    """Answer this prompt and exit instead of opening the interactive prompt (repeatable)."""
    idle_timeout: float | None = None
    """End the interactive session after this many seconds without input (unset: wait forever)."""
    device: str = "auto"
    """Where the model runs: auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)
        SamplingConfig.__post_init__(self)
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError(f"--idle_timeout {self.idle_timeout!r}: must be > 0 seconds")
        if not _DEVICE.match(self.device):
            raise ValueError(
                f"--device {self.device!r}: must be auto, cpu, mps, cuda or cuda:N"
            )

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(**fields_of(self, SamplingConfig))


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device here (try --device cpu)")
    return device


def main(cfg: PromptConfig) -> None:
    from gpt.export import load_export
    from gpt.repl import GOODBYE, PROMPT, Chat, interact
    from gpt.tokenizer import tokenizer_from_json

    rundir = cfg.rundir
    device = resolve_device(cfg.device)
    model, tokenizer_json = load_export(rundir.model_dir, device=device)
    try:
        tokenizer = tokenizer_from_json(tokenizer_json)
    except (ValueError, TypeError) as e:
        raise InputError(f"{rundir.model_dir}/tokenizer.json: not a valid tokenizer: {e}") from None
    if tokenizer.vocab_size > model.config.vocab_size:
        raise InputError(
            f"{rundir.model_dir}: tokenizer has {tokenizer.vocab_size} tokens but the model "
            f"only {model.config.vocab_size}; re-export it with `python -m gpt train`"
        )
    chat = Chat(model, tokenizer, cfg.sampling, cfg.seed, rundir.transcript_jsonl, sys.stdout)
    print(
        f"generative-prompt: model from {rundir.model_dir} ({model.num_params() / 1e6:.2f}M "
        f"parameters, {tokenizer.name} tokenizer, context {model.config.block_size} tokens) "
        f"on {device}; transcript: {rundir.transcript_jsonl}",
        file=sys.stderr,
    )
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
