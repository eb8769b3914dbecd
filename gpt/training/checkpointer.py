"""What train-gpt keeps in a checkpoint, restoring it, and when one is due by the clock (the
files themselves: gpt/training/checkpoint_files.py)."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gpt.config.configs import LORA_FLAGS, TrainConfig
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.fetch.model_source import parse as parse_init_from
from gpt.models.model import GPT
from gpt.training import checkpoint_files, report, sharded_checkpoint
from gpt.training.batches import TokenData
from gpt.training.checkpoint_files import CheckpointState, TrainState
from gpt.training.ema import WeightAverage
from gpt.training.optimizer import build_optimizer
from gpt.training.sharding import is_sharded


def _adapters(flags: dict) -> dict:
    """The LoRA flags of a run's `flags` (a checkpoint's saved ones, or a resumed run's), which
    shape its adapters: part of the model, as a checkpoint holds the adapters alone or none
    (without adapters the other two shape nothing: their defaults)."""
    defaults = {k: getattr(TrainConfig, k) for k in LORA_FLAGS}
    given = {k: flags.get(k, defaults[k]) for k in LORA_FLAGS}
    return given if given["lora_rank"] else defaults


class Checkpointer:
    """The checkpoints of one run. Each holds the run's whole training state: the weights, the
    optimizer, the weight average (if any), the `TrainState` (progress) and every rank's RNGs,
    with the facts a resume checks beside them (`CheckpointState`: the model and average as
    built, the flags, the data's identity, the number of ranks)."""

    def __init__(self, cfg: TrainConfig, world: World, data: TokenData, model: GPT,
                 optimizer: torch.optim.Optimizer, average: WeightAverage | None,
                 log: Callable[[str], None], plain: Callable[[], GPT] | None = None) -> None:
        self.cfg, self.world, self.rundir, self.data = cfg, world, cfg.rundir, data
        self.model, self.optimizer, self.average, self.log = model, optimizer, average, log
        self.plain = plain
        """Builds a plain copy of a sharded `model` (its initial weights), which a whole
        checkpoint is read into before its tensors are sent in shards."""
        self.saved_at = time.perf_counter()
        """When the last checkpoint was written (or training started), by this rank's clock."""

    def restore_or_start(self, latest: Path | None, saved: CheckpointState | None) -> TrainState:
        """Load `latest` (ckpt/LATEST, if --resume allows and there is one), whose state is
        `saved`, and return its progress. Without one, clear what an earlier attempt left."""
        cfg, rundir, world = self.cfg, self.rundir, self.world
        if latest is None:
            if cfg.resume == "require":
                raise InputError(f"--resume require: no checkpoint to resume in {rundir.ckpt_dir}")
            if world.is_main:  # a fresh start must not mix with an earlier attempt's files
                checkpoint_files.clear(rundir)
                rundir.train_jsonl.unlink(missing_ok=True)
            return TrainState()
        self._check_compatible(latest, saved)
        average = self.average.model if self.average else None
        if checkpoint_files.is_sharded(latest):  # into any number of ranks, sharded or not
            sharded_checkpoint.load(latest, self.model, self.optimizer, average, saved)
        elif is_sharded(self.model):  # a whole checkpoint, read by rank 0 and sent in shards
            whole = self._read_whole(latest) if world.is_main else None
            sharded_checkpoint.load_whole(whole, self.model, self.optimizer, average)
        else:
            checkpoint_files.load_weights(latest, self.model, self.optimizer, world.device,
                                          average)
        state = dataclasses.replace(saved.train)  # a copy: training advances it
        rngs = checkpoint_files.read_rngs(latest)
        # A rank the saved run did not have keeps its fresh seed.
        if str(world.rank) in rngs:
            checkpoint_files.set_rng_state(rngs[str(world.rank)], world.device)
        if world.is_main:
            # and the staging dirs of a write that was cut off
            checkpoint_files.prune(rundir, cfg.keep_last)
            report.keep_until(rundir.train_jsonl, state.step)
        return state

    def _read_whole(self, path: Path) -> tuple[GPT, torch.optim.Optimizer, GPT | None]:
        """Whole checkpoint `path` loaded into a plain model, optimizer and average on the CPU
        (`plain` builds the model), for a sharded run to take its shards from."""
        cpu = torch.device("cpu")
        model = self.plain()
        average = copy.deepcopy(model) if self.average else None
        optimizer = build_optimizer(model, self.cfg, cpu)
        checkpoint_files.load_weights(path, model, optimizer, cpu, average)
        return model, optimizer, average

    def _check_compatible(self, path: Path, saved: CheckpointState) -> None:
        def diff(before: dict, now: dict) -> list[str]:
            return [f"{k} {before.get(k)!r} -> {v!r}" for k, v in now.items() if before.get(k) != v]

        hint = "use a new --run, or --resume never to start over"
        for what, before, now in (
            ("on different data", saved.data, self.data.meta.identity()),
            ("with a different model",
             {**dataclasses.asdict(saved.model), **_adapters(saved.config)},
             {**dataclasses.asdict(self.model.config), **_adapters(dataclasses.asdict(self.cfg))}),
        ):
            if changed := diff(before, now):
                raise InputError(f"{path}: trained {what} ({'; '.join(changed)}); {hint}")
        self._check_same_start(path, saved)
        flags = {k: v for k, v in dataclasses.asdict(self.cfg).items()
                 if k not in ("root", "run", "resume")}
        if changed := diff(saved.config, flags):
            self.log(f"resuming with changed flags: {'; '.join(changed)}")

    def _check_same_start(self, path: Path, saved: CheckpointState) -> None:
        """What the run started from is an input like its data: resuming from another
        --init_from (or none, or a folder since gone under another name) would go on training
        weights that did not come from it, and say so in the export."""
        if "init_from" not in saved.config:  # a checkpoint from before --init_from
            return
        before, now = saved.config["init_from"], self.cfg.init_from
        if before == now or (before and now and parse_init_from(before).canonical
                             == parse_init_from(now).canonical):  # fmt: skip
            return
        started = f"--init_from {before!r}" if before else "random weights (no --init_from)"
        raise InputError(f"--init_from {now!r}: run {self.cfg.run!r} started from {started} "
                         f"(its checkpoint {path.name}); give that to resume it, or start over "
                         "with --resume never")

    def clock_due(self) -> bool:
        """Whether ckpt_interval_s passed since the last checkpoint by rank 0's clock (False on
        the other ranks: `agree` then carries rank 0's answer to all)."""
        interval = self.cfg.ckpt_interval_s
        return self.world.is_main and 0 < interval <= time.perf_counter() - self.saved_at

    def save(self, state: TrainState) -> None:
        """Write the checkpoint of iteration `state.step` (every rank gives its RNGs; rank 0
        writes, or with --shard every rank its shards)."""
        rngs = self.world.gather_json(checkpoint_files.rng_state(self.world.device))
        average = self.average.model if self.average else None
        facts = CheckpointState(
            train=state,
            model=self.model.config,
            ema_decay=self.average.decay if self.average else 0.0,
            data=self.data.meta.identity(),
            config=dataclasses.asdict(self.cfg),
            world_size=self.world.size,
        )
        path = None
        if self.cfg.shard:
            path = sharded_checkpoint.save(self.rundir, self.world, self.model, self.optimizer,
                                           average, facts, rngs, self.cfg.keep_last)
        elif self.world.is_main:
            path = checkpoint_files.save(self.rundir, state.step, self.model, self.optimizer, facts,
                                   rngs, self.cfg.keep_last, average)
        if path is not None:
            self.log(f"saved checkpoint {path.name}")
        self.saved_at = time.perf_counter()
