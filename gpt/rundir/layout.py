"""The run directory: one folder per run under a root (`/gpt` on the cluster, any folder locally).

This is the data contract between the stages (docs/architecture.md, "The run directory"). Every
path of a run directory is named here and nowhere else (the files inside one checkpoint or one
export are gpt/training/checkpoint_files.py's and gpt/models/export.py's): `RunDir.meta_json` is a
`RunFile`, the file's place inside any run (`RunDir.meta_json.rel == "data/meta.json"`), and
`rundir.meta_json` its path in one run. `data/meta.json` itself is `DataMeta`, written and read
through that one class.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from gpt.errors import InputError
from gpt.rundir import atomic

# A run id becomes a directory name (and, on the cluster, part of a TrainJob name): keep it to a
# safe, portable alphabet. KFP run ids (UUIDs) fit.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise InputError(
            f"--run {run_id!r}: not a valid run id (letters, digits, '.', '_', '-'; "
            "starts with a letter or digit; at most 128 characters)"
        )
    return run_id


@dataclass(frozen=True)
class RunFile:
    """A file or folder of every run directory, by its path inside it (`data/meta.json`).

    On the class, `RunDir.meta_json` is this reference (what a stage names as its output); on a
    run, `rundir.meta_json` is the `Path` in that run.
    """

    rel: str

    @overload
    def __get__(self, rundir: None, owner: type) -> RunFile: ...
    @overload
    def __get__(self, rundir: RunDir, owner: type) -> Path: ...
    def __get__(self, rundir: RunDir | None, owner: type | None = None) -> RunFile | Path:
        return self if rundir is None else rundir.path / self.rel

    def __str__(self) -> str:
        return self.rel


@dataclass(frozen=True)
class RunDir:
    """Paths inside `<root>/<run_id>/`."""

    root: Path
    run_id: str

    @classmethod
    def of(cls, root: str | Path, run_id: str) -> RunDir:
        return cls(Path(root), check_run_id(run_id))

    @property
    def path(self) -> Path:
        return self.root / self.run_id

    @property
    def lock(self) -> Path:
        """The run's lock (gpt/rundir/runlock.py): beside the run directory, not in it."""
        return self.root / f".{self.run_id}.lock"

    # corpus/: the text as it was cleaned, and where it came from
    corpus_dir = RunFile("corpus")
    source_json = RunFile("corpus/source.json")
    text_txt = RunFile("corpus/text.txt")
    # data/: token ids and the tokenizer, what training reads
    data_dir = RunFile("data")
    train_bin = RunFile("data/train.bin")
    val_bin = RunFile("data/val.bin")
    train_mask = RunFile("data/train.mask")  # chat data: which tokens the loss counts
    val_mask = RunFile("data/val.mask")
    tokenizer_json = RunFile("data/tokenizer.json")
    meta_json = RunFile("data/meta.json")
    # ckpt/: resumable training state
    ckpt_dir = RunFile("ckpt")
    latest = RunFile("ckpt/LATEST")
    # model/: the exported model the prompt stage loads
    model_dir = RunFile("model")
    model_config = RunFile("model/config.json")  # the export's architecture and shape
    # adapter/: a LoRA run's adapters alone, in PEFT's format, for the model it started from
    adapter_dir = RunFile("adapter")
    # metrics/: what a person reads about training
    metrics_dir = RunFile("metrics")
    train_jsonl = RunFile("metrics/train.jsonl")
    loss_png = RunFile("metrics/loss.png")
    report_md = RunFile("metrics/report.md")
    init_from_json = RunFile("metrics/init_from.json")  # what a fine-tuned run started from
    # prompt/: the conversation with the trained model
    transcript_jsonl = RunFile("prompt/transcript.jsonl")

    def ckpt_step(self, iteration: int) -> Path:
        return self.ckpt_dir / f"step-{iteration}"


# ---- data/meta.json ---------------------------------------------------------------------------

DTYPES = ("uint16", "uint32")


def dtype_for(vocab_size: int) -> str:
    """The token files' dtype: the smallest of DTYPES that holds every id."""
    return "uint16" if vocab_size < 2**16 else "uint32"


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object of an earlier run (meta.json, source.json) as a plain dict, compared key by
    key; {} when it is missing, unreadable or not an object."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


@dataclass(frozen=True)
class CorpusInputs:
    """What decides a run's corpus and data: equal inputs mean a rerun has nothing to do."""

    source: str
    tokenizer: str
    compact: bool
    max_vocab: int
    val_fraction: float
    block_size: int
    corpus_sha256: str
    init_from: str = dataclasses.field(default="", kw_only=True)
    """The pretrained model whose tokenizer made the data (--init_from, canonical); "" for
    none, as in every meta.json written before it was an input."""
    documents: int = dataclasses.field(default=1, kw_only=True)
    """The documents the cleaned text holds (records, files), end-of-text between each two in
    the token files where the tokenizer has one (`eot_id`). 1 where meta.json has none: a
    text of one document, or data made before documents were told apart (one stream)."""
    chat: bool = dataclasses.field(default=False, kw_only=True)
    """Conversations (load-corpus --chat true, gpt/data/conversations.py): the token files are
    rows of block_size + 1 tokens, each whole conversations then padding, and
    data/{train,val}.mask say which tokens the loss counts. False where meta.json has none."""

    def changed(self, old: dict[str, Any]) -> list[str]:
        """The input names whose value in `old` (an earlier meta.json) differs from this one."""
        return [k for k, v in dataclasses.asdict(self).items()
                if old.get(k, ADDED_INPUTS.get(k)) != v]  # fmt: skip


# Inputs added to meta.json since it was first written, and what their absence meant.
ADDED_INPUTS: dict[str, Any] = {"init_from": "", "documents": 1, "chat": False}
# Outputs likewise: what the token files hold, and what their absence meant.
ADDED_OUTPUTS: dict[str, Any] = {"train_counted": 0, "val_counted": 0}


@dataclass(frozen=True)
class DataMeta(CorpusInputs):
    """`data/meta.json`: the inputs that made the data, and what the token files hold.

    load-corpus writes it (`write`), train-gpt reads it (`read`); nothing else spells its keys.
    """

    vocab_size: int
    eot_id: int | None
    dtype: str
    train_tokens: int
    val_tokens: int
    train_bytes: int
    val_bytes: int
    train_counted: int = dataclasses.field(default=0, kw_only=True)
    """Chat data: the tokens of the training split the loss counts (0: every one, text). The
    bytes of chat data (`train_bytes`, `val_bytes`) are those of the counted tokens, so bits
    per byte measure the assistant's text alone."""
    val_counted: int = dataclasses.field(default=0, kw_only=True)
    """Chat data: the tokens of the validation split the loss counts (0: every one, text)."""

    def write(self, path: Path) -> None:
        # An added input or output at what its absence meant is left out: data made without it
        # keeps the bytes it always had.
        added = {**ADDED_INPUTS, **ADDED_OUTPUTS}
        fields = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in added or v != added[k]}  # fmt: skip
        atomic.write_json(path, fields, what="the data's description")

    @classmethod
    def read(cls, path: Path) -> DataMeta:
        try:
            raw = {**ADDED_INPUTS, **ADDED_OUTPUTS, **json.loads(path.read_text())}
            meta = cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: unreadable ({e})") from None
        except KeyError as e:
            raise InputError(
                f"{path}: missing key {e}; re-run `python -m gpt load-corpus`"
            ) from None
        if meta.dtype not in DTYPES:
            raise InputError(f"{path}: dtype {meta.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("vocab_size", "train_tokens", "val_tokens", "train_bytes", "val_bytes"):
            value = getattr(meta, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{path}: {name} {value!r} is not a positive integer")
        return meta

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must have been trained on to be resumed on this data."""
        return {
            "corpus_sha256": self.corpus_sha256,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
            "train_tokens": self.train_tokens,
            "val_tokens": self.val_tokens,
        }

    def describe(self) -> str:
        """The data in one line, for logs and reports."""
        chat = (f" in conversations, the loss on the assistant's {self.train_counted:,} / "
                f"{self.val_counted:,}" if self.chat else "")
        return (f"{self.tokenizer} tokenizer, vocab {self.vocab_size}, {self.train_tokens:,} "
                f"train / {self.val_tokens:,} validation tokens{chat}")

    def bits_per_byte(self, nats_per_token: float) -> float:
        """Validation loss per byte of cleaned text (chat data: of the tokens the loss counts),
        in bits: comparable across tokenizers."""
        return nats_per_token * (self.val_counted or self.val_tokens) / (
            self.val_bytes * math.log(2))
