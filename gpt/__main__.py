"""`python -m gpt <stage> [--flag value ...]`: the single command line for every stage.

Each stage is a module exposing a config dataclass and a `main(cfg)` function; its flags are the
config's fields. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import sys

from gpt.config import parse_config
from gpt.errors import InputError

# stage -> (module, config class, one-line summary)
STAGES: dict[str, tuple[str, str, str]] = {
    "corpus": ("gpt.corpus", "CorpusConfig", "load-corpus: fetch, clean and tokenize a text"),
    "train": ("gpt.train", "TrainConfig", "train-gpt: train a GPT on the run's data, resumably"),
    "prompt": ("gpt.prompt", "PromptConfig", "generative-prompt: talk to the trained model"),
}

USAGE = "usage: python -m gpt <stage> [--help] [flags]\n\nstages:\n" + "".join(
    f"  {name:<8} {summary}\n" for name, (_, _, summary) in STAGES.items()
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `torchrun -m gpt -- train ...`: some Pythons pass the "--" on
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    stage, rest = argv[0], argv[1:]
    if stage not in STAGES:
        print(f"gpt: error: unknown stage {stage!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    module_name, config_name, summary = STAGES[stage]
    module = importlib.import_module(module_name)
    prog = f"python -m gpt {stage}"
    try:
        cfg = parse_config(getattr(module, config_name), rest, prog, summary)
        module.main(cfg)
    except (ValueError, InputError) as e:
        # ValueError comes from a config's validation, InputError from a stage refusing its
        # input; any other exception is a bug and keeps its traceback.
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
