"""The training loop of train-gpt: one `Trainer` per process, the same code for one process or
many (gpt/train_gpt.py runs it).

Under torchrun every rank builds the same model from the same seed, trains its share of each
step's windows, and DDP averages the gradients; rank 0 alone writes files. What a restart needs
beyond weights, optimizer and RNGs is a checkpoint's `CheckpointState` (gpt/training/checkpoint.py);
what the run's unset flags become, new or resumed, gpt/training/resume_rule.py decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.config.configs import TrainConfig
from gpt.data.batches import Batches, TokenData, eval_batches, eval_offsets
from gpt.data.objectstore import Store
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.models.export import save_export
from gpt.models.model import GPT
from gpt.models.spelling import free_vectors, spelling_of
from gpt.rundir.atomic import append_jsonl
from gpt.stages import TRAIN_GPT, to_args
from gpt.training import checkpoint, faults, report
from gpt.training.checkpoint import CheckpointState, TrainState
from gpt.training.divergence import Divergence
from gpt.training.ema import WeightAverage
from gpt.training.resume_rule import resolve_settings
from gpt.training.stopping import Stopped, StopRequest

# Dense bf16 peak FLOP/s, for MFU. A GPU not listed shows no MFU rather than a wrong one.
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}


class _WithGradOf(torch.autograd.Function):
    """`table` itself, whose gradient in backward is its own plus what `earlier` has gathered."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
        ctx.earlier = earlier
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad + ctx.earlier.grad, None


class StepEmbedding:
    """A spelled embedding's table (`GPT.embedding()`) built once per optimizer step, not once
    per micro-step: at GPT-2's vocabulary its backward (embedding_bag's, which sorts the
    n-grams of every token) is the same work for any micro-batch.

    The micro-steps before the last train a detached copy, whose gradient they sum; the last one
    trains the table itself, with that sum added to its gradient, so the table's backward runs
    once, within the last backward (the one DDP all-reduces in). The table's values are the same
    as a per-micro-step build's; the n-gram table's gradient is the spelling's backward of the
    summed gradient rather than the sum of the backwards: equal to float32 rounding, and
    bit-equal with one micro-step (tests/workload/test_train_gpt.py), which then does not use this.
    """

    def __init__(self, model: GPT) -> None:
        self.table = model.embedding()  # (padded vocab, C)
        self.earlier = self.table.detach().requires_grad_()

    def for_micro_step(self, last: bool) -> torch.Tensor:
        return _WithGradOf.apply(self.table, self.earlier) if last else self.earlier


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup, then cosine decay to min_lr at max_iters.

    A function of the step alone: the wall clock never reaches the arithmetic, so equal seeds give
    equal weights and a resumed run continues exactly where it stopped. A --time_budget only
    picks the step to stop at.
    """
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    progress = (step - cfg.warmup_iters) / (cfg.max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def build_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on the 2-D weights (matmuls, embeddings) only, not on biases and
    LayerNorm gains, which set scales rather than store features."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel is one launch for all parameters on CUDA, and faster on CPU as well; it
    # is also what skips the updates after a non-finite step (`found_inf`,
    # gpt/training/divergence.py).
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, cfg.beta2), fused=True)


def c_compiler() -> str | None:
    """What Triton (torch.compile on CUDA) builds its kernel launchers with, as it looks for one
    (triton/runtime/build.py): $CC, else gcc, else clang; None if there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Trainer:
    def __init__(self, cfg: TrainConfig, world: World, stop: StopRequest | None = None) -> None:
        self.cfg, self.world, self.rundir = cfg, world, cfg.rundir
        self.stop = stop or StopRequest(TRAIN_GPT.prog)
        """Noted signals; `fit` answers one at the next step end (gpt/training/stopping.py)."""
        self.device = world.device
        self.data = TokenData.load(self.rundir)
        self.data.check_block_size(cfg.block_size)
        self.micro_batch = self._micro_batch_size()
        self.tokens_per_step = cfg.batch_size * cfg.block_size
        self.batches = Batches(self.data.train, cfg.block_size, cfg.batch_size, cfg.seed)
        self.eval_windows = eval_offsets(
            len(self.data.val), cfg.block_size, cfg.eval_iters * cfg.batch_size
        )

        latest = checkpoint.find_latest(self.rundir) if cfg.resume != "never" else None
        saved = checkpoint.read_state(latest) if latest is not None else None
        settings = resolve_settings(cfg, self.data.meta.vocab_size, self.data.meta.train_tokens,
                                    saved)
        seed_everything(cfg.seed)  # every rank builds the same initial weights
        free = free_vectors(self.data.train_counts)
        spelling = spelling_of(self.data.tokenizer, settings.model.spelling, free)
        self.model = GPT(settings.model, spelling).to(self.device)
        self.model.chunked_loss = cfg.chunked_loss
        self.optimizer = build_optimizer(self.model, cfg, self.device)
        self.average = WeightAverage(self.model, settings.ema_decay) if settings.ema_decay else None
        """The weights that evaluation and the export use, when there is an average."""
        self.divergence = Divergence(self.device)
        self.state = TrainState()
        seed_everything(cfg.seed + world.rank)  # but draws its own dropout masks
        self.resumed_from = self._restore_or_start(latest, saved)

        # What runs the training step: maybe compiled, then wrapped by DDP. self.model stays the
        # plain module for evaluation, checkpoints and export.
        self.step_model = self._build_step_model()
        self.bf16 = self._use_bf16(cfg.dtype)
        cuda = self.device.type == "cuda"
        peaks = [v for k, v in PEAK_FLOPS.items() if cuda and k in torch.cuda.get_device_name()]
        self.peak_flops = world.size * peaks[0] if peaks and self.bf16 else None

    def _micro_batch_size(self) -> int:
        """Sequences per rank per micro-step: --batch_size split over the ranks and micro-steps."""
        cfg, size = self.cfg, self.world.size
        if cfg.batch_size % (size * cfg.grad_accum):
            raise InputError(
                f"--batch_size {cfg.batch_size}: must split evenly over {size} process(es) "
                f"x --grad_accum {cfg.grad_accum} micro-steps"
            )
        return cfg.batch_size // (size * cfg.grad_accum)

    def _build_step_model(self) -> torch.nn.Module:
        """The model the training step runs: compiled (--compile; unset: on CUDA, if Triton can
        build its kernel launchers there), then wrapped by DDP under torchrun."""
        cuda = self.device.type == "cuda"
        compiled = self.cfg.compile
        if compiled is None:
            compiled = cuda and c_compiler() is not None
            if cuda and not compiled:
                self.log("train-gpt: not compiling, as Triton finds no C compiler ($CC, gcc or "
                         "clang) to build kernels with; install one, or pass --compile false")
        step_model = torch.compile(self.model) if compiled else self.model
        # Every buffer is a constant of the config and the tokenizer (rotary tables, the
        # spelling, the padding mask), equal on every rank from the start: DDP's default would
        # send rank 0's again before each forward, the spelling's 8 MB at GPT-2's vocabulary.
        return DDP(step_model, broadcast_buffers=False) if self.world.distributed else step_model

    def _use_bf16(self, dtype: str) -> bool:
        """Whether --dtype means bfloat16 autocast here; --dtype float32 also turns TF32 off."""
        cuda = self.device.type == "cuda"
        has_bf16 = not cuda or torch.cuda.is_bf16_supported()
        if dtype == "bfloat16" and not has_bf16:
            raise InputError(f"--dtype bfloat16: {torch.cuda.get_device_name()} has no bfloat16; "
                             "use --dtype float32")
        if dtype == "float32":
            torch.set_float32_matmul_precision("highest")  # asked for: no TF32 either
        return dtype == "bfloat16" or (dtype == "auto" and cuda and has_bf16)

    def _autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def log(self, message: str) -> None:
        if self.world.is_main:
            print(message, flush=True)

    # -- start or resume ---------------------------------------------------------------------

    def _restore_or_start(self, latest: Path | None, saved: CheckpointState | None) -> str | None:
        """Load `latest` (ckpt/LATEST, if --resume allows and there is one), whose state is
        `saved`; return its name. Without one, clear what an earlier attempt left."""
        cfg, rundir = self.cfg, self.rundir
        if latest is None:
            if cfg.resume == "require":
                raise InputError(f"--resume require: no checkpoint to resume in {rundir.ckpt_dir}")
            if self.world.is_main:  # a fresh start must not mix with an earlier attempt's files
                checkpoint.clear(rundir)
                rundir.train_jsonl.unlink(missing_ok=True)
            return None
        self._check_compatible(latest, saved)
        average = self.average.model if self.average else None
        checkpoint.load_weights(latest, self.model, self.optimizer, self.device, average)
        self.state = dataclasses.replace(saved.train)  # a copy: training advances it
        rngs = checkpoint.read_rngs(latest)
        # A rank the saved run did not have keeps its fresh seed.
        if str(self.world.rank) in rngs:
            checkpoint.set_rng_state(rngs[str(self.world.rank)], self.device)
        if self.world.is_main:
            checkpoint.prune(rundir, cfg.keep_last)  # staging dirs of a write that was cut off
            report.keep_until(rundir.train_jsonl, self.state.step)
        return latest.name

    def _check_compatible(self, path: Path, saved: CheckpointState) -> None:
        def diff(before: dict, now: dict) -> list[str]:
            return [f"{k} {before.get(k)!r} -> {v!r}" for k, v in now.items() if before.get(k) != v]

        hint = "use a new --run, or --resume never to start over"
        for what, before, now in (
            ("on different data", saved.data, self.data.meta.identity()),
            ("with a different model", dataclasses.asdict(saved.model),
             dataclasses.asdict(self.model.config)),
        ):
            if changed := diff(before, now):
                raise InputError(f"{path}: trained {what} ({'; '.join(changed)}); {hint}")
        flags = {k: v for k, v in vars(self.cfg).items() if k not in ("root", "run", "resume")}
        if changed := diff(saved.config, flags):
            self.log(f"resuming with changed settings: {'; '.join(changed)}")

    # -- the loop -----------------------------------------------------------------------------

    def done(self) -> bool:
        st, cfg = self.state, self.cfg
        return st.step >= cfg.max_iters or 0 < cfg.time_budget <= st.elapsed_s

    def fit(self) -> None:
        cfg, st, world = self.cfg, self.state, self.world
        self.log(
            f"train-gpt: {self.model.describe()} | {world.size} process(es) on "
            f"{self.device.type}, {torch.get_num_threads()} thread(s) each | {cfg.batch_size} x "
            f"{cfg.block_size} = {self.tokens_per_step:,} tokens per step | "
            f"{self.data.meta.describe()}"
        )
        if self.resumed_from:
            self.log(f"resumed from {self.resumed_from}: step {st.step}, "
                     f"{_duration(st.elapsed_s)} trained so far")
        start, start_elapsed = time.perf_counter(), st.elapsed_s
        self._mark = (start, st.step)
        self._saved_at = start
        last_val: dict[str, float] | None = None
        if self.world.agree([self.stop.requested])[0]:  # asked before training began
            raise Stopped(f"stopped by {self._signal_name()} before training; nothing new to save")
        while not self.done():
            lr = lr_at(cfg, st.step)
            loss = self._train_step(lr)
            st.step += 1
            st.tokens += self.tokens_per_step
            st.elapsed_s = start_elapsed + time.perf_counter() - start
            if cfg.time_budget:  # rank 0's clock decides, so every rank stops at the same step
                st.elapsed_s = world.from_main(st.elapsed_s)
            faults.step_done(st.step, world.rank)
            # Step 1 too: after a long compile, the first line says training runs, and how fast.
            log_due = st.step % cfg.log_interval == 0 or st.step == 1
            eval_due = st.step % cfg.eval_interval == 0 or self.done()
            stop, clock_due = self.world.agree([self.stop.requested, self._clock_due()])
            checkpoint_due = st.step % cfg.ckpt_interval == 0 or self.done() or clock_due or stop
            if log_due or eval_due or checkpoint_due:
                self.divergence.check()  # before anything of this step is written
            record: dict[str, Any] = {}
            if log_due:
                record |= self._log_progress(loss, lr)
            if eval_due:
                record |= (last_val := self.evaluate())
            if record and world.is_main:
                append_jsonl(self.rundir.train_jsonl,
                             {"step": st.step, "elapsed_s": st.elapsed_s, **record},
                             what=f"the metrics of step {st.step}")
            if checkpoint_due:
                self._save_checkpoint()
            if stop and not self.done():
                raise Stopped(
                    f"stopped by {self._signal_name()} at step {st.step} of {cfg.max_iters}, "
                    f"checkpoint written; run the same command to resume"
                )
        if last_val is None:  # nothing left to train: a restart after the end re-exports
            last_val = self.evaluate()
        if world.is_main:
            self._export_and_report(last_val)

    def _clock_due(self) -> bool:
        """Whether ckpt_interval_s passed since the last checkpoint by rank 0's clock (False on
        the other ranks: `agree` then carries rank 0's answer to all)."""
        interval = self.cfg.ckpt_interval_s
        return self.world.is_main and 0 < interval <= time.perf_counter() - self._saved_at

    def _signal_name(self) -> str:
        # Every rank stops when any rank was signalled; name the signal where it is known.
        return self.stop.signal.name if self.stop.signal else "a signal to another rank"

    def _train_step(self, lr: float) -> torch.Tensor:
        """One optimizer step on this rank's share of the step's windows; returns its mean loss."""
        cfg, world, st = self.cfg, self.world, self.state
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        accum = cfg.grad_accum
        total = torch.zeros((), device=self.device)
        shared = None
        if self.model.spelled and accum > 1:
            with self._autocast():  # as it would be built inside the forward
                shared = StepEmbedding(self.model)
        for micro in range(accum):
            x, y = self.batches.get(st.step, world.rank * accum + micro, world.size * accum,
                                    self.device)
            # DDP all-reduces gradients during backward; only the last micro-step needs that.
            last = micro == accum - 1
            no_sync = self.step_model.no_sync() if world.distributed and not last else None
            with no_sync or contextlib.nullcontext():
                with self._autocast():
                    table = shared.for_micro_step(last) if shared else None
                    # [1]: the logits (where there are any) go at once, not after backward
                    loss = self.step_model(x, y, embedding=table)[1]
                loss = faults.loss_of(loss, st.step + 1, world.rank)
                (loss / accum).backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf)
        # The norm is of the all-reduced gradients, so every rank sees a bad step together.
        self.optimizer.found_inf = self.divergence.record(st.step + 1, total / accum, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average:
            self.average.update(self.model, st.step + 1)
        return total / accum

    def _log_progress(self, loss: torch.Tensor, lr: float) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        loss_value = self.world.sum([loss.item()])[0] / self.world.size
        now = time.perf_counter()
        since, since_step = self._mark
        self._mark = (now, st.step)
        per_step = (now - since) / max(1, st.step - since_step)
        tokens_per_s = self.tokens_per_step / per_step
        eta = (cfg.max_iters - st.step) * per_step
        if cfg.time_budget:
            eta = min(eta, cfg.time_budget - st.elapsed_s)
        mfu = ""
        record = {"loss": loss_value, "lr": lr, "tokens_per_s": tokens_per_s}
        if self.peak_flops:
            record["mfu"] = self.model.flops_per_token() * tokens_per_s / self.peak_flops
            mfu = f" | MFU {record['mfu']:.1%}"
        self.log(
            f"step {st.step:>5}/{cfg.max_iters} | loss {loss_value:.4f} | lr {lr:.2e} | "
            f"{tokens_per_s:,.0f} tok/s{mfu} | {_duration(st.elapsed_s)} elapsed, "
            f"ETA {_duration(eta)}"
        )
        return record

    @property
    def eval_model(self) -> GPT:
        """The model evaluation and the export see: the weight average, or the weights."""
        return self.average.model if self.average else self.model

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean validation loss over the fixed evaluation windows, split over the ranks."""
        model = self.eval_model
        model.eval()
        mine = self.eval_windows[self.world.rank :: self.world.size]
        # Summed on the device (in float64, as a Python float would be): one wait at the end,
        # not one per batch.
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with self._autocast():
            table = model.embedding()  # once, not per batch: the weights do not change
        for x, y in eval_batches(self.data.val, mine, self.cfg.block_size, self.micro_batch,
                                 self.device):
            with self._autocast():
                loss = model(x, y, embedding=table)[1]
            total += loss.double() * len(x)
        total, count = self.world.sum([total.item(), len(mine)])
        self.model.train()  # the average stays in eval mode: it never trains
        val = total / count
        bpb = self.data.meta.bits_per_byte(val)
        self.log(f"step {self.state.step}: val loss {val:.4f} nats/token, {bpb:.3f} bits/byte")
        self._mark = (time.perf_counter(), self.state.step)  # tokens/s counts training only
        return {"val_loss": val, "val_bpb": bpb}

    def _save_checkpoint(self) -> None:
        rngs = self.world.gather_json(checkpoint.rng_state(self.device))
        if self.world.is_main:
            state = CheckpointState(
                train=self.state,
                model=self.model.config,
                ema_decay=self.average.decay if self.average else 0.0,
                data=self.data.meta.identity(),
                config=dataclasses.asdict(self.cfg),
                world_size=self.world.size,
            )
            path = checkpoint.save(self.rundir, self.state.step, self.model, self.optimizer,
                                   state, rngs, self.cfg.keep_last,
                                   self.average.model if self.average else None)
            self.log(f"saved checkpoint {path.name}")
        self._saved_at = time.perf_counter()
        self._mark = (self._saved_at, self.state.step)

    def _export_and_report(self, val: dict[str, float]) -> None:
        cfg, st, rundir = self.cfg, self.state, self.rundir
        save_export(self.eval_model, self.data.tokenizer, rundir.model_dir)
        stopped_by = "max_iters" if st.step >= cfg.max_iters else "time_budget"
        settings = {k: v for k, v in vars(cfg).items() if k not in ("root", "run")}
        report.write(rundir, report.Summary(
            model=self.model.describe(),
            data=self.data.meta.describe(),
            training=(
                f"{st.step} steps of {cfg.batch_size} x {cfg.block_size} tokens, "
                f"{st.tokens:,} tokens in {st.elapsed_s:.0f} s "
                f"({st.tokens / max(st.elapsed_s, 1e-9):,.0f} tokens/s), "
                f"{self.world.size} process(es) on {self.device.type}; stopped by {stopped_by}"
            ),
            val_loss=val["val_loss"],
            val_bpb=val["val_bpb"],
            command=shlex.join(TRAIN_GPT.command(to_args(settings))),
        ))
        self.log(
            f"done: {st.step} steps, {st.tokens:,} tokens in {_duration(st.elapsed_s)} "
            f"(stopped by {stopped_by}); val {val['val_loss']:.4f} nats/token, "
            f"{val['val_bpb']:.3f} bits/byte; model in {rundir.model_dir}, "
            f"report in {rundir.report_md}"
        )
        if cfg.export_uri:  # the local export is whole by now: copy it as it is
            Store(cfg.export_uri, "--export_uri").upload_dir(rundir.model_dir, self.log)
