"""The training loop of train-gpt: one `Trainer` per process, the same code for one process or
many (gpt/train_gpt.py runs it).

Under torchrun every rank builds the same model from the same seed, trains its share of each
iteration's windows, and DDP averages the gradients (or, with --shard, FSDP2 shards the model
over the ranks: gpt/training/sharding.py); rank 0 alone writes files (but a sharded checkpoint's
shards, which each rank writes). What a restart needs
beyond weights, optimizer and RNGs is a checkpoint's `CheckpointState`
(gpt/training/checkpoint_files.py);
what every unset flag becomes, new, fine-tuned or resumed, gpt/training/recipe.py decides
before the model is built: the trainer runs on its finished config.

The loop is `Trainer`; what it calls lives beside it: optimizer.py (AdamW, the learning-rate
schedule), compute.py (compile, DDP, bfloat16), evaluation.py, checkpointer.py (what a checkpoint
holds, restoring it), metrics.py (the progress line and records), trainer_status.py (the same
progress in the TrainJob's status, where Kubeflow Trainer asks for it), report.py, and
init_from.py (where a new fine-tuning run's weights come from).
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import time
from typing import Any

import numpy as np
import torch

from gpt.config.configs import TrainConfig
from gpt.distributed.world import World
from gpt.fetch.objectstore import Store
from gpt.models import lora, pretrained
from gpt.models.export import load_unpadded, save_export
from gpt.models.model import GPT
from gpt.models.spelling import free_vectors, spelling_of
from gpt.rundir.atomic import append_jsonl
from gpt.stages import TRAIN_GPT
from gpt.training import checkpoint_files, faults, report
from gpt.training.batches import Batches, TokenData
from gpt.training.checkpoint_files import CheckpointState
from gpt.training.checkpointer import Checkpointer
from gpt.training.compute import (
    autocast,
    build_training_model,
    check_fused_loss,
    device_facts,
    micro_batch_size,
    use_bf16,
)
from gpt.training.divergence import Divergence
from gpt.training.ema import WeightAverage
from gpt.training.evaluation import Evaluator
from gpt.training.init_from import Start, recorded
from gpt.training.memory_estimate import check_memory
from gpt.training.metrics import TrainingProgress, duration, fraction_done, peak_flops
from gpt.training.optimizer import build_optimizer, lr_at
from gpt.training.recipe import Recipe, finish
from gpt.training.sharding import full_weights, shard, whole
from gpt.training.stopping import Stopped, StopRequest
from gpt.training.trainer_status import StatusReporter


class _WithGradOf(torch.autograd.Function):
    """`table` itself, whose gradient in backward is its own plus what `earlier` has gathered."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
        ctx.earlier = earlier
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad + ctx.earlier.grad, None


class IterationEmbedding:
    """A spelled embedding's table (`GPT.embedding()`) built once per iteration, not once per
    micro-batch: at GPT-2's vocabulary its backward (embedding_bag's, which sorts the
    n-grams of every token) is the same work for any micro-batch.

    The micro-batches before the last train a detached copy, whose gradient they sum; the last one
    trains the table itself, with that sum added to its gradient, so the table's backward runs
    once, within the last backward (the one DDP all-reduces in). The table's values are the same
    as a per-micro-batch build's; the n-gram table's gradient is the spelling's backward of the
    summed gradient rather than the sum of the backwards: equal to float32 rounding, and
    bit-equal with one micro-batch (tests/workload/test_train_gpt.py), which then does not use this.
    """

    def __init__(self, model: GPT) -> None:
        self.table = model.embedding()  # (padded vocab, C)
        self.earlier = self.table.detach().requires_grad_()

    def for_micro_batch(self, last: bool) -> torch.Tensor:
        return _WithGradOf.apply(self.table, self.earlier) if last else self.earlier


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def build_model(recipe: Recipe, data: TokenData, start: Start | None = None) -> GPT:
    """The run's model as its recipe says, the same initial weights on every rank; a new
    fine-tuning run's weights `start`'s pretrained ones (--init_from)."""
    cfg = recipe.config
    seed_everything(cfg.seed)
    spelling = spelling_of(data.tokenizer, recipe.model.spelling, free_vectors(data.train_counts))
    model = GPT(recipe.model, spelling)
    model.chunked_loss = cfg.chunked_loss
    model.fused_loss = cfg.fused_loss
    model.activation_checkpointing = cfg.activation_checkpointing
    if start is not None:
        load_unpadded(model, pretrained.initial_weights(start.model, recipe.model, start.rows))
    if cfg.lora_rank:
        lora.add_adapters(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets.split(","))
    return model


def finished_config(cfg: TrainConfig, world: World, data: TokenData,
                    saved: CheckpointState | None, start: Start | None) -> Recipe:
    """`cfg` with every unset flag decided (gpt/training/recipe.py), before anything is built:
    from the data, the device, the resumed checkpoint's state `saved`, and a new fine-tuning
    run's pretrained model (`start`, whose flags must fit it)."""
    if start is not None:
        pretrained.check_flags(cfg, start.model.config)
    return finish(cfg, data.meta.vocab_size, data.meta.train_tokens, saved,
                  start.model.config if start is not None else None, device_facts(world.device))


class Trainer:
    """train-gpt's loop: builds the run (model, optimizer, weight average, the model an
    iteration runs), restores it from a checkpoint or starts it, then trains iteration by
    iteration; between iterations it logs progress, evaluates, checkpoints and answers a stop,
    and at the end exports the model and writes the report. Evaluation, checkpoints and
    progress have classes of their own (evaluation.py, checkpointer.py, metrics.py): this one
    says when each happens."""

    def __init__(self, cfg: TrainConfig, world: World, stop: StopRequest | None = None) -> None:
        self.world, self.rundir = world, cfg.rundir
        self.stop = stop or StopRequest(TRAIN_GPT.prog)
        """Noted signals; `fit` answers one at the next iteration's end
        (gpt/training/stopping.py)."""
        self.device = world.device
        check_fused_loss(cfg.fused_loss, self.device)
        self.data = TokenData.load(self.rundir)
        self.data.check_block_size(cfg.block_size)
        self.micro_batch = micro_batch_size(cfg, world)

        latest = checkpoint_files.find_latest(self.rundir) if cfg.resume != "never" else None
        saved = checkpoint_files.read_state(latest) if latest is not None else None
        # The pretrained weights are read at iteration 0 only: a resumed run has its own, but
        # for a LoRA run's, whose checkpoints hold the adapters alone, the rest frozen.
        start = None
        if cfg.init_from and (saved is None or cfg.lora_rank):
            start = Start.of(cfg, world, self.data, self.rundir, self.log)
            if saved is not None:
                start.check_same_weights(self.rundir)
        recipe = finished_config(cfg, world, self.data, saved, start)
        for note in recipe.notes:
            self.log(note)
        self.cfg = cfg = recipe.config
        """The finished flags (gpt/training/recipe.py): every unset one decided, read-only."""
        self.tokens_per_iter = cfg.batch_size * cfg.block_size
        self.batches = Batches(self.data.train, cfg.block_size, cfg.batch_size, cfg.seed,
                               self.data.train_mask)
        self.evaluator = Evaluator(self.data, cfg, world, self.micro_batch)
        model = build_model(recipe, self.data, start)
        check_memory(model, cfg, world, self.micro_batch, self.log)
        self.recipe = recipe
        self.sharded = cfg.shard and world.distributed
        """Whether the model (and the average, a copy of it) are sharded over the ranks; one
        process trains the plain model, but writes sharded checkpoints too."""
        # Sharded, FSDP2 moves it to the device a block at a time, each block's shard kept: no
        # rank holds the whole model there.
        self.model = model if self.sharded else model.to(self.device)
        self.average = WeightAverage(self.model, cfg.ema_decay) if cfg.ema_decay else None
        """The weights that evaluation and the export use, when there is an average."""
        if self.sharded:  # before the optimizer, which then holds the shards
            for module in (self.model, self.average.model if self.average else None):
                if module is not None:
                    shard(module)
        self.optimizer = build_optimizer(self.model, cfg, self.device)
        self.divergence = Divergence(self.device)
        self.checkpointer = Checkpointer(cfg, world, self.data, self.model, self.optimizer,
                                         self.average, self.log, self._plain_model)
        seed_everything(cfg.seed + world.rank)  # but draws its own dropout masks
        self.state = self.checkpointer.restore_or_start(latest, saved)
        """The progress; with the model, optimizer, average and RNGs, what a checkpoint saves."""
        self.lora_base = start.fetched if start is not None and cfg.lora_rank else None
        """Where a LoRA run's frozen weights came from, which its adapter/ names; None without
        LoRA. (Not `start`, which holds the pretrained tensors.)"""
        self.started_from = recorded(start, cfg, world)
        """What the model was fine-tuned from, in one line ("" from scratch)."""
        self.resumed_from = latest.name if latest is not None else None

        # What runs the training iteration: maybe compiled, then wrapped by DDP (unless
        # sharded). self.model stays the module for evaluation, checkpoints and export.
        self.training_model = build_training_model(self.model, world, cfg.compile, self.sharded)
        self.bf16 = use_bf16(cfg.dtype)
        self.peak_flops = peak_flops(world, self.bf16)
        self.progress = TrainingProgress(cfg, self.tokens_per_iter,
                                         self.model.flops_per_token(), self.peak_flops, self.log)
        self.status = StatusReporter.from_env(self.log) if world.is_main else None
        """Rank 0's progress in the TrainJob's status (gpt/training/trainer_status.py); None
        where Kubeflow Trainer gave this container no status server."""

    def _autocast(self):
        return autocast(self.bf16, self.device)

    def log(self, message: str) -> None:
        if self.world.is_main:
            print(message, flush=True)

    # -- the loop -----------------------------------------------------------------------------

    def done(self) -> bool:
        st, cfg = self.state, self.cfg
        return st.step >= cfg.max_iters or 0 < cfg.time_budget <= st.elapsed_s

    def fit(self) -> None:
        cfg, st, world = self.cfg, self.state, self.world
        self._log_start()
        start, start_elapsed = time.perf_counter(), st.elapsed_s
        self.progress.restart(st.step)
        self.checkpointer.saved_at = start
        last_val: dict[str, float] | None = None
        if world.agree([self.stop.requested])[0]:  # asked before training began
            raise Stopped(f"stopped by {self._signal_name()} before training; nothing new to save")
        while not self.done():
            lr = lr_at(cfg, st.step)
            loss = self._train_iteration(lr)
            st.step += 1
            st.tokens += self.tokens_per_iter
            st.elapsed_s = start_elapsed + time.perf_counter() - start
            if cfg.time_budget:  # rank 0's clock decides, so every rank stops at the same iteration
                st.elapsed_s = world.from_main(st.elapsed_s)
            faults.iteration_done(st.step, world.rank)
            last_val = self._between_iterations(loss, lr) or last_val
        if last_val is None:  # nothing left to train: a restart after the end re-exports
            last_val = self.evaluate()
        exported = self._exported()
        if world.is_main:
            self._export_and_report(exported, last_val)
        if self.status:
            self.status.finish(last_val)

    def _log_start(self) -> None:
        cfg, st = self.cfg, self.state
        self.log(
            f"train-gpt: {self.model.describe()} | {self.world.size} process(es) on "
            f"{self.device.type}, {torch.get_num_threads()} thread(s) each | {cfg.batch_size} x "
            f"{cfg.block_size} = {self.tokens_per_iter:,} tokens per step | "
            f"{self.data.meta.describe()}"
        )
        if self.resumed_from:
            self.log(f"resumed from {self.resumed_from}: step {st.step}, "
                     f"{duration(st.elapsed_s)} trained so far")

    def _between_iterations(self, loss: torch.Tensor, lr: float) -> dict[str, float] | None:
        """What is due after the iteration just done: its progress line, an evaluation (whose result
        it returns), a checkpoint, a stop (`Stopped`)."""
        cfg, st = self.cfg, self.state
        # Iteration 1 too: after a long compile, the first line says training runs, and how fast.
        log_due = st.step % cfg.log_interval == 0 or st.step == 1
        eval_due = st.step % cfg.eval_interval == 0 or self.done()
        stop, clock_due = self.world.agree([self.stop.requested, self.checkpointer.clock_due()])
        checkpoint_due = st.step % cfg.ckpt_interval == 0 or self.done() or clock_due or stop
        if log_due or eval_due or checkpoint_due:
            self.divergence.check()  # before anything of this iteration is written
        record: dict[str, Any] = {}
        val = None
        if log_due:
            mean_loss = self.world.sum([loss.item()])[0] / self.world.size
            record |= self.progress.record(st, mean_loss, lr)
        if eval_due:
            record |= (val := self.evaluate())
        if record and self.world.is_main:
            record = {"step": st.step, "elapsed_s": st.elapsed_s, **record}
            append_jsonl(self.rundir.train_jsonl, record, what=f"the metrics of step {st.step}")
            if self.status:
                self.status.report(fraction_done(cfg, st), self.progress.remaining_s(st), record)
        if checkpoint_due:
            self.checkpointer.save(st)
            self.progress.restart(st.step)
        if stop and not self.done():
            raise Stopped(
                f"stopped by {self._signal_name()} at step {st.step} of {cfg.max_iters}, "
                f"checkpoint written; run the same command to resume"
            )
        return val

    def _signal_name(self) -> str:
        # Every rank stops when any rank was signalled; name the signal where it is known.
        return self.stop.signal.name if self.stop.signal else "a signal to another rank"

    def _train_iteration(self, lr: float) -> torch.Tensor:
        """One iteration on this rank's share of its windows; returns its mean loss."""
        cfg, world, st = self.cfg, self.world, self.state
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum = cfg.grad_accum
        total = torch.zeros((), device=self.device)
        shared = None
        # A sharded model's weights are whole only inside its forward: it builds the table there.
        if self.model.spelled and accum > 1 and not self.sharded:
            with self._autocast():  # as it would be built inside the forward
                shared = IterationEmbedding(self.model)
        for micro in range(accum):
            x, y = self.batches.get(st.step, world.rank * accum + micro, world.size * accum,
                                    self.device)
            # DDP all-reduces gradients during backward; only the last micro-batch needs that.
            last = micro == accum - 1
            ddp = world.distributed and not self.sharded  # FSDP2 reduce-scatters every one
            no_sync = self.training_model.no_sync() if ddp and not last else None
            with no_sync or contextlib.nullcontext():
                with self._autocast():
                    table = shared.for_micro_batch(last) if shared else None
                    # [1]: the logits (where there are any) go at once, not after backward
                    loss = self.training_model(x, y, embedding=table)[1]
                loss = faults.loss_of(loss, st.step + 1, world.rank)
                (loss / accum).backward()
            total += loss.detach()
        norm = whole(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                    cfg.grad_clip or math.inf))
        # The norm is of the all-reduced gradients, so every rank sees a bad iteration together.
        self.optimizer.found_inf = self.divergence.record(st.step + 1, total / accum, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average:
            self.average.update(self.model, st.step + 1)
        return total / accum

    @property
    def eval_model(self) -> GPT:
        """The model evaluation and the export see: the weight average, or the weights."""
        return self.average.model if self.average else self.model

    def evaluate(self) -> dict[str, float]:
        """Mean validation loss over the fixed evaluation windows, split over the ranks."""
        val = self.evaluator(self.eval_model, self._autocast)
        self.model.train()  # the average stays in eval mode: it never trains
        self.log(f"step {self.state.step}: val loss {val['val_loss']:.4f} nats/token, "
                 f"{val['val_bpb']:.3f} bits/byte")
        self.progress.restart(self.state.step)  # tokens/s counts training only
        return val

    def _exported(self) -> GPT | None:
        """The model the export writes, on rank 0 (None on the others): the evaluated weights;
        sharded, gathered whole (every rank takes part) into a plain copy on rank 0's CPU."""
        if not self.sharded:
            return self.eval_model if self.world.is_main else None
        weights = full_weights(self.eval_model)
        if not self.world.is_main:
            return None
        plain = self._plain_model()
        plain.load_state_dict(weights)
        return plain

    def _plain_model(self) -> GPT:
        """A plain (unsharded) model of the run's shape on the CPU, for whole weights. It seeds
        the RNGs anew: built only before they are restored, or after training."""
        return build_model(self.recipe, self.data)

    def _export_and_report(self, model: GPT, val: dict[str, float]) -> None:
        cfg, st, rundir = self.cfg, self.state, self.rundir
        save_export(model, self.data.tokenizer, rundir.model_dir,
                    finetuned_from=self.started_from)
        if self.lora_base is not None:
            lora.save_adapters(self.eval_model, self.model.config, rundir.adapter_dir,
                               self.lora_base.source, self.lora_base.revision)
        else:  # an earlier attempt's, of a LoRA run started over without it, fits no model/ now
            shutil.rmtree(rundir.adapter_dir, ignore_errors=True)
        where = f"{self.world.size} process(es) on {self.device.type}"
        report.write(rundir, report.summary(cfg, st, val, self.model.describe(),
                                            self.data.meta.describe(), where,
                                            self.started_from))
        self.log(
            f"done: {st.step} steps, {st.tokens:,} tokens in {duration(st.elapsed_s)} "
            f"(stopped by {report.stopped_by(cfg, st)}); val {val['val_loss']:.4f} nats/token, "
            f"{val['val_bpb']:.3f} bits/byte; model in {rundir.model_dir}, "
            f"report in {rundir.report_md}"
        )
        if cfg.export_uri:  # the local export is whole by now: copy it as it is
            Store(cfg.export_uri, "--export_uri").upload_dir(rundir.model_dir, self.log)
