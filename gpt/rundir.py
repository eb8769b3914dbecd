"""The run directory: one folder per run under a root (`/gpt` on the cluster, any folder locally).

This is the data contract between the stages; see DESIGN.md. Every path a stage reads or writes
is named here and nowhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpt.errors import InputError

# A run id becomes a directory name (and, on the cluster, part of a TrainJob name): keep it to a
# safe, portable alphabet. KFP run ids (UUIDs) fit.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run: str) -> str:
    if not _RUN_ID.match(run) or ".." in run:
        raise InputError(
            f"--run {run!r}: not a valid run id (letters, digits, '.', '_', '-'; "
            "starts with a letter or digit; at most 128 characters)"
        )
    return run


@dataclass(frozen=True)
class RunDir:
    """Paths inside `<root>/<run>/`."""

    root: Path
    run: str

    @classmethod
    def of(cls, root: str | Path, run: str) -> RunDir:
        return cls(Path(root), check_run_id(run))

    @property
    def path(self) -> Path:
        return self.root / self.run

    # corpus/: the text as it was cleaned, and where it came from
    @property
    def corpus_dir(self) -> Path:
        return self.path / "corpus"

    @property
    def source_json(self) -> Path:
        return self.corpus_dir / "source.json"

    @property
    def text_txt(self) -> Path:
        return self.corpus_dir / "text.txt"

    # data/: token ids and the tokenizer, what training reads
    @property
    def data_dir(self) -> Path:
        return self.path / "data"

    @property
    def train_bin(self) -> Path:
        return self.data_dir / "train.bin"

    @property
    def val_bin(self) -> Path:
        return self.data_dir / "val.bin"

    @property
    def tokenizer_json(self) -> Path:
        return self.data_dir / "tokenizer.json"

    @property
    def meta_json(self) -> Path:
        return self.data_dir / "meta.json"

    # ckpt/: resumable training state
    @property
    def ckpt_dir(self) -> Path:
        return self.path / "ckpt"

    @property
    def latest(self) -> Path:
        return self.ckpt_dir / "LATEST"

    def ckpt_step(self, step: int) -> Path:
        return self.ckpt_dir / f"step-{step}"

    # model/: the exported model the prompt stage loads
    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    # metrics/: what a person reads about training
    @property
    def metrics_dir(self) -> Path:
        return self.path / "metrics"

    @property
    def train_jsonl(self) -> Path:
        return self.metrics_dir / "train.jsonl"

    @property
    def loss_png(self) -> Path:
        return self.metrics_dir / "loss.png"

    @property
    def report_md(self) -> Path:
        return self.metrics_dir / "report.md"

    # prompt/: the conversation with the trained model
    @property
    def transcript_jsonl(self) -> Path:
        return self.path / "prompt" / "transcript.jsonl"
