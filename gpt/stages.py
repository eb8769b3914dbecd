"""The stage table: each stage of the pipeline is one row, and every name it has derives from one.

A stage's name is its pipeline step's name (`train-gpt`); from it come the command line
`python -m gpt train-gpt` (under torchrun: `torchrun ... -m gpt -- train-gpt`), the module that
runs it (`gpt/train_gpt.py`), the ClusterTrainingRuntime `gpt-train-gpt` (runtimes/) and the KFP
component module (`components/train_gpt.py`). The CLI (gpt/config/cli.py), the components
(components/step/dispatch.py), the local backend and the tests all read this table. No PyTorch
here: a stage's module, which does the work, is imported only when the stage runs. See
docs/architecture.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpt.config.configs import CorpusConfig, PromptConfig, RunConfig, TrainConfig
from gpt.rundir.layout import RunDir, RunFile


@dataclass(frozen=True)
class Stage:
    name: str
    """The one name: pipeline step, CLI subcommand, TrainJob name prefix."""
    summary: str
    """One line for `python -m gpt --help`."""
    config: type[RunConfig]
    """Its flags (gpt/config/configs.py)."""
    outputs: tuple[RunFile, ...]
    """Run-directory files the component turns into KFP artifacts."""
    distributed: bool = False
    """Runs under torchrun (several processes per node, several nodes)."""
    optional: tuple[RunFile, ...] = ()
    """Run-directory files the component reads too where the run wrote them."""

    @property
    def carried(self) -> tuple[RunFile, ...]:
        """Every file the component reads back: the outputs, and the optional ones."""
        return self.outputs + self.optional

    @property
    def runtime(self) -> str:
        """The ClusterTrainingRuntime its TrainJobs run against (runtimes/<runtime>.yaml)."""
        return f"gpt-{self.name}"

    @property
    def module(self) -> str:
        """The module whose `main(cfg)` runs the stage (gpt/<name with underscores>.py; imported
        when the stage runs: PyTorch)."""
        return "gpt." + self.name.replace("-", "_")

    @property
    def component_module(self) -> str:
        """The KFP component's module (components/<name with underscores>.py)."""
        return "components." + self.name.replace("-", "_")

    @property
    def prog(self) -> str:
        return f"python -m gpt {self.name}"

    def command(
        self, args: Sequence[str], *, python: Sequence[str] = ("python",),
        torchrun: Sequence[str] | None = None,
    ) -> list[str]:
        """The stage's command line: `<python> -m gpt <name> <args>`, or with `torchrun` (its
        program and options) `<torchrun> -m gpt -- <name> <args>`: without the "--", torchrun's
        parser would take the stage's --run as an abbreviation of its own --run-path."""
        if torchrun is not None:
            return [*torchrun, "-m", "gpt", "--", self.name, *args]
        return [*python, "-m", "gpt", self.name, *args]

    def main(self, cfg: RunConfig) -> None:
        """Run the stage in this process: its module's `main(cfg)`."""
        importlib.import_module(self.module).main(cfg)


LOAD_CORPUS = Stage(
    "load-corpus",
    "fetch, clean and tokenize a text",
    CorpusConfig,
    (RunDir.meta_json, RunDir.source_json),
)
TRAIN_GPT = Stage(
    "train-gpt",
    "train a GPT on the run's data, resumably",
    TrainConfig,
    (RunDir.train_jsonl, RunDir.report_md, RunDir.loss_png),
    distributed=True,
    # a fine-tuned run's (--init_from); the export's config, which the model registry's entry
    # reads (components/step/registration.py) and a finished run always writes
    optional=(RunDir.init_from_json, RunDir.model_config),
)
GENERATIVE_PROMPT = Stage(
    "generative-prompt",
    "talk to the trained model",
    PromptConfig,
    (RunDir.transcript_jsonl,),
)
STAGES: dict[str, Stage] = {s.name: s for s in (LOAD_CORPUS, TRAIN_GPT, GENERATIVE_PROMPT)}


def to_args(values: Mapping[str, Any]) -> list[str]:
    """`{"n_layer": 4, "compact": True, "prompt": ["a", "b"]}` -> a stage's command line.

    Booleans become true/false (the CLI's boolean flags take a value), a list repeats its flag,
    None leaves the flag out (the CLI's default, e.g. no top-k limit).
    """
    args: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            text = str(item).lower() if isinstance(item, bool) else str(item)
            args += [f"--{key}", text]
    return args
