"""Where a new fine-tuning run starts (--init_from): `Start` fetches the pretrained model (rank 0
first, the others from the cache it filled), checks the data was tokenized for it, reads its
weights and maps its embedding rows to the data's ids; `recorded` writes what a new run starts
from to metrics/init_from.json (a resumed run reads it back) and says it in one line, for the
report and the export.

Only a run that starts at iteration 0 builds a `Start`: a resumed one restores its checkpoint and
never opens --init_from again (gpt/training/trainer.py), but for a LoRA run (--lora_rank), whose
checkpoints hold the adapters alone: it reads its frozen weights again, and they must be the ones
it started from (`check_same_weights`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpt.config.configs import TrainConfig
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.fetch.model_source import MODEL_FILES, Fetched, fetch
from gpt.models import pretrained
from gpt.models.pretrained import Pretrained
from gpt.rundir.atomic import write_json
from gpt.rundir.layout import RunDir
from gpt.tokenizer.recognition import pretrained_tokenizer
from gpt.training.batches import TokenData


@dataclass(frozen=True)
class Start:
    """A new fine-tuning run's starting point (--init_from): the pretrained model, where it
    came from, and which of its embedding rows each of the data's ids starts from."""

    fetched: Fetched
    model: Pretrained
    rows: np.ndarray

    @classmethod
    def of(cls, cfg: TrainConfig, world: World, data: TokenData, rundir: RunDir,
           say: Callable[[str], None]) -> Start:
        """Fetch --init_from (rank 0 first, the others then find it cached), refuse data of
        another vocabulary before any weights load, then read them."""
        if not data.meta.init_from:
            raise InputError(f"{rundir.meta_json}: the data was not tokenized for a "
                             f"pretrained model; run load-corpus with --init_from "
                             f"{cfg.init_from} (and --overwrite true)")
        fetched, failed = None, None
        if world.is_main:
            try:
                fetched = fetch(cfg.init_from, cfg.root, MODEL_FILES, say)
            except InputError as e:
                failed = e
        # Every rank learns whether rank 0 has the files (the others would otherwise wait
        # for it in the next collective forever); rank 0's own line says why not.
        if world.agree([failed is not None])[0]:
            raise failed or InputError(f"--init_from {cfg.init_from!r}: rank 0 could not "
                                       "fetch it (its log says why)")
        if not world.is_main:  # from the cache rank 0 filled: no download, no Hub request
            fetched = fetch(cfg.init_from, cfg.root, MODEL_FILES, say=lambda _: None,
                            offline=True)
        rows = pretrained.row_map(data.tokenizer, pretrained_tokenizer(fetched.path),
                                  str(rundir.tokenizer_json))
        if cfg.lora_rank and (rows == pretrained.NEW).any():
            raise InputError(
                f"--lora_rank {cfg.lora_rank}: --init_from {cfg.init_from} has no chat markers: "
                "they would be new rows of the embedding, which LoRA keeps frozen, both at its "
                "mean (a turn's start and end alike to the model); fine-tune fully first "
                "(--lora_rank 0; --activation_checkpointing true or --shard true save memory), "
                "then LoRA from that run")
        model = pretrained.read(fetched.path)
        say(f"init_from: {fetched.source}{f' at {fetched.revision}' if fetched.revision else ''}: "
            f"{model.config.n_layer} layers x {model.config.n_head} heads x "
            f"{model.config.n_embd} wide, context {model.config.block_size}, vocab "
            f"{model.config.vocab_size:,}; weights sha256 {model.weights_sha256[:16]}...")
        return cls(fetched, model, rows)

    def check_same_weights(self, rundir: RunDir) -> None:
        """A resumed LoRA run's frozen weights are read again: refuse weights other than those
        it started from (metrics/init_from.json's sha256), which its adapters were trained
        on."""
        try:
            before = json.loads(rundir.init_from_json.read_text()).get("weights_sha256")
        except (OSError, ValueError, AttributeError):
            before = None  # no record to hold them to: a checkpoint from before the record
        if before is not None and before != self.model.weights_sha256:
            raise InputError(f"--init_from {self.fetched.source}: its weights (sha256 "
                             f"{self.model.weights_sha256[:16]}...) are not those the run's "
                             f"adapters were trained on ({rundir.init_from_json}: "
                             f"{str(before)[:16]}...); give those, or start over with "
                             "--resume never")

    def record(self) -> dict[str, Any]:
        return {"init_from": self.fetched.source, "revision": self.fetched.revision,
                "weights_sha256": self.model.weights_sha256}  # fmt: skip


def recorded(start: Start | None, cfg: TrainConfig, world: World) -> str:
    """What the run was fine-tuned from, in one line ("" from scratch): a new run's `start`,
    which rank 0 writes to metrics/init_from.json, or a resumed one's, read back from it."""
    if start is not None:
        record = start.record()
        if world.is_main:
            write_json(cfg.rundir.init_from_json, record,
                       what="the record of what the run started from")  # fmt: skip
    elif cfg.init_from:
        try:
            record = json.loads(cfg.rundir.init_from_json.read_text())
        except (OSError, ValueError):
            return ""
    else:
        return ""
    revision = f" at revision {record['revision']}" if record.get("revision") else ""
    return f"{record.get('init_from')}{revision} (weights sha256 {record.get('weights_sha256')})"
