"""Variants of train-gpt's iteration A/B against the default, one after another in one process.

Each variant builds the real `Trainer` (as bench/train_speed.py does) at vs_nanogpt's GPT-2 124M
shape on the plays, at its 64 x 1 split (64 sequences of 1,024 a micro-batch, one per iteration),
and runs the iteration `fit()` runs: the first one timed apart (it compiles), WARMUP more, then
STEPS timed ones, then the allocator's peak. Every variant starts from the same seed and draws
the same batches, so its losses are the default's up to arithmetic: the largest relative gap of
its loss curve to the default's is this benchmark's precision check of the two (the issue's bar
for a change to the math: 1%). A variant is a train-gpt flag (what vs_nanogpt can then run with,
`flags`) or an Inductor setting made here only (`inductor`: a mode of torch.compile that
train-gpt does not offer; bench-only until it wins).

Before the variants, the fused loss's kernel against `F.cross_entropy` on one chunk of GPT-2's
logits in bf16 (a 4,096 x 50,304 chunk, as the chunked loss cuts them): the largest difference
of the losses and of the gradient, and each one's time.

Shapes: on CUDA GPT-2 124M compiled, bf16 (the Trainer's defaults there). On a CPU a check that
the code runs, not a measurement: a tiny model on the comedy's characters, eager, the fused loss
in Triton's interpreter (TRITON_INTERPRET=1, set here before Triton is imported).
Each variant's row is written to the results (and printed, `gpu_variants: {...}`) as it ends,
so a call cut short keeps what finished.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import vs_nanogpt
from bench.harness import Result, default_corpus

STEPS, WARMUP = 30, 10  # after the first: 41 iterations a variant, ~6 s of GPU time at 64 x 1
MICRO_BATCH = 64


@dataclass(frozen=True)
class Variant:
    label: str
    flags: dict[str, Any] = field(default_factory=dict)
    """train-gpt flags (TrainConfig fields) this variant sets."""
    inductor: dict[str, Any] = field(default_factory=dict)
    """torch._inductor.config settings while it compiles (bench-only)."""


VARIANTS = [
    Variant("default"),
    Variant("fused loss", flags={"fused_loss": True}),
    # torch.compile(mode="max-autotune-no-cudagraphs"): what that mode sets (list_mode_options).
    # Last: its compile takes minutes, and a cut call keeps the rows before it.
    Variant("max-autotune-no-cudagraphs",
            inductor={"max_autotune": True, "coordinate_descent_tuning": True}),
]


def config(root: Path, run: str, cuda: bool, **flags: Any):
    """The TrainConfig of every variant: vs_nanogpt's shape on CUDA, a tiny one on a CPU."""
    from gpt.config.configs import TrainConfig

    if cuda:
        shape = vs_nanogpt.shape_for(cuda=True, quick=False)
        model = dict(n_layer=shape.n_layer, n_head=shape.n_head, n_embd=shape.n_embd,
                     block_size=shape.block_size, batch_size=MICRO_BATCH)
    else:
        model = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4)
    return TrainConfig(root=str(root), run=run, device="cuda" if cuda else "cpu", grad_accum=1,
                       max_iters=1000, dropout=0.0, bias=False, resume="never", **model, **flags)


@contextlib.contextmanager
def inductor_settings(settings: dict[str, Any]) -> Iterator[None]:
    import torch._inductor.config as inductor

    with inductor.patch(settings) if settings else contextlib.nullcontext():
        yield


def measure(cfg, variant: Variant, cuda: bool) -> dict[str, Any]:
    """One variant's first iteration, its rate over STEPS after WARMUP, its losses and peak."""
    import torch

    from gpt.distributed import world as distributed
    from gpt.training.trainer import Trainer

    torch._dynamo.reset()  # else a variant of the same graph reuses the last one's compile
    world = distributed.setup(cfg.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with inductor_settings(variant.inductor):
            trainer = Trainer(replace(cfg, **variant.flags), world)
            losses = []

            def step() -> None:
                losses.append(trainer._train_iteration(trainer.cfg.learning_rate))
                trainer.state.step += 1

            t0 = time.perf_counter()
            step()
            sync()
            first_s = time.perf_counter() - t0
            for _ in range(WARMUP):
                step()
            sync()
            t0 = time.perf_counter()
            for _ in range(STEPS):
                step()
            sync()
            seconds = time.perf_counter() - t0
        row = {
            "variant": variant.label, "flags": variant.flags, "inductor": variant.inductor,
            "tokens_per_s": STEPS * trainer.tokens_per_iter / seconds,
            "ms/step": f"{seconds / STEPS * 1e3:.1f}", "first step": f"{first_s:.1f} s",
            "first_step_s": first_s, "losses": torch.stack(losses).tolist(),
        }  # fmt: skip
        row["tokens/s"] = f"{row['tokens_per_s']:,.0f}"
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated()
            row["peak memory"] = f"{row['peak_bytes'] / 2**30:.1f} GiB"
        if trainer.bf16 and trainer.peak_flops:
            row["mfu"] = trainer.model.flops_per_token() * row["tokens_per_s"] / trainer.peak_flops
            row["MFU"] = f"{row['mfu']:.1%}"
    finally:  # the model, its optimizer and its compiled code go before the next variant
        trainer = step = None
        distributed.teardown(world)
        torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def kernel_check(cuda: bool) -> dict[str, Any]:
    """The fused loss's kernel against F.cross_entropy of the float32 copy, one chunk of bf16
    logits: the largest differences, and the time of each (forward and backward)."""
    import torch
    import torch.nn.functional as F

    from gpt.models.fused_loss import cross_entropy_rows

    rows, vocab, padded = (4096, 50257, 50304) if cuda else (37, 300, 320)
    device = "cuda" if cuda else "cpu"
    g = torch.Generator(device).manual_seed(0)
    logits = (torch.randn(rows, padded, device=device, generator=g) * 4).bfloat16()
    logits[:, vocab:] = float("-inf")
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    targets[::7] = -100
    keep = targets != -100
    ids, scale = torch.where(keep, targets, 0), 1 / keep.sum()

    def reference() -> tuple[torch.Tensor, torch.Tensor]:
        wanted = logits.float().requires_grad_()
        loss = F.cross_entropy(wanted, targets)
        loss.backward()
        return loss.detach(), wanted.grad.bfloat16()

    def fused() -> tuple[torch.Tensor, torch.Tensor]:
        grad = logits.clone()
        return cross_entropy_rows(grad, ids, keep, scale, True).sum() * scale, grad

    timed = {}
    for name, fn in (("reference", reference), ("fused", fused)):
        fn()  # warm-up (and the kernel's compile)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, grad = fn()
        if cuda:
            torch.cuda.synchronize()
        timed[name] = (loss, grad, time.perf_counter() - t0)
    (ref_loss, ref_grad, ref_s), (loss, grad, fused_s) = timed["reference"], timed["fused"]
    return {"rows": rows, "padded_vocab": padded, "loss_gap": abs(loss - ref_loss).item(),
            "grad_gap": (grad.float() - ref_grad.float()).abs().max().item(),
            "grad_scale": ref_grad.float().abs().max().item(),
            "reference_ms": ref_s * 1e3, "fused_ms": fused_s * 1e3}  # fmt: skip


def interpret_off_cuda(cuda: bool) -> bool:
    """On a CPU, Triton's interpreter for the fused loss; False if Triton was imported before
    (TRITON_INTERPRET is read as a kernel is decorated), where it cannot be."""
    if cuda:
        return True
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def run(quick: bool, results: Path | None = None) -> Result:
    import torch

    from bench.train_speed import _fresh_compile_cache

    cuda = torch.cuda.is_available()
    fused_runs = interpret_off_cuda(cuda)
    result = Result(
        "gpu_variants",
        {"micro_batch": MICRO_BATCH if cuda else 4, "steps": STEPS, "warmup": WARMUP,
         "device_name": torch.cuda.get_device_name() if cuda else "cpu"},
        ["variant", "tokens/s", "vs default", "ms/step", "first step", "peak memory", "MFU",
         "largest loss gap to the default"],
    )  # fmt: skip
    if fused_runs:
        result.settings["kernel_check"] = kernel_check(cuda)
        print(f"gpu_variants: kernel {json.dumps(result.settings['kernel_check'])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-variants-") as tmp:
        root = Path(tmp)
        if cuda:
            data_run, _ = vs_nanogpt.prepare_data(vs_nanogpt.shape_for(True, quick), root, quick)
        else:
            data_run = default_corpus(root, "data", tokenizer="char").run_id
        for variant in VARIANTS if not quick or cuda else VARIANTS[:2]:
            if variant.flags.get("fused_loss") and not fused_runs:
                print(f"gpu_variants: {variant.label}: skipped (Triton imported before its "
                      "interpreter could be set)", flush=True)
                continue
            print(f"gpu_variants: {variant.label} ...", flush=True)
            run_name = vs_nanogpt.linked_run(root, data_run, f"variant-{len(result.rows)}")
            with _fresh_compile_cache(str(root / run_name)):  # no kernels of the one before
                row = measure(config(root, run_name, cuda), variant, cuda)
            result.rows.append(row)
            print(f"gpu_variants: {json.dumps({k: v for k, v in row.items() if k != 'losses'})}",
                  flush=True)
            compare(result.rows)
            if results is not None:
                result.settings["quick"] = quick
                result.write(results)
    return result


def compare(rows: list[dict[str, Any]]) -> None:
    """Each row's rate against the default's, and the largest relative gap of its losses."""
    base = rows[0]
    for row in rows:
        row["ratio_to_default"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["vs default"] = f"{row['ratio_to_default']:.3f}x"
        gap = max(abs(b - a) / abs(a) for a, b in zip(base["losses"], row["losses"], strict=True))
        row["largest_loss_gap"] = gap
        row["largest loss gap to the default"] = f"{gap:.3%}"


def winners(path: Path, margin: float = 0.01) -> dict[str, Any]:
    """The train-gpt flags of every variant at least `margin` faster than the default in the
    results file `path` (what bench/gpu_session.sh hands vs_nanogpt)."""
    flags: dict[str, Any] = {}
    for row in json.loads(path.read_text())["rows"]:
        if row["flags"] and row["ratio_to_default"] >= 1 + margin:
            flags |= row["flags"]
    return flags


if __name__ == "__main__":  # python -m bench.gpu_variants winners RESULTS.json
    if sys.argv[1:2] != ["winners"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.gpu_variants winners RESULTS.json")
    print(json.dumps(winners(Path(sys.argv[2]))))
