"""Peak memory of a training step's model work, ours against nanoGPT's, with and without the
chunked loss: how many float32 (B, T, V) tensors each holds at its peak.

Each case runs in a process of its own: it builds the model and AdamW (and compiles it, in the
compiled mode), trains one optimizer step of `accum` micro-steps to warm up, then two more the
way its trainer does (nanoGPT's train.py keeps the logits of a micro-step until the next one's
forward returns; train-gpt drops them), and reports their peak above what it held before them:
on CUDA the allocator's peak, on a CPU the resident memory, sampled every half millisecond
(glibc serves tensors this large with mmap, so a freed one leaves it).

Shapes: on CUDA GPT-2 124M at 16 and 64 sequences of 1,024 a micro-step, bf16 autocast, eager
(vs_nanogpt measures the compiled programs, whole processes); on a CPU a model small beside its
GPT-2 vocabulary (1 x 2 x 64, 8 sequences of 256), where the logits are nearly all of the memory,
eager in float32 and compiled in bf16 autocast, with chunks of 512 rows (`chunk_rows`) so the
2,048 positions are four chunks, as GPT-2's 16 x 1,024 are on a GPU. Both with 50,257 ids
(nanoGPT: 50,304, its padding trained as ids).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from bench.harness import Result
from bench.vs_nanogpt import NANOGPT, REPO, require_nanogpt

VOCAB = 50257
CASES = ("nanoGPT", "ours, whole logits", "ours, chunked loss")


def shapes(cuda: bool, quick: bool) -> list[dict[str, Any]]:
    if cuda:
        gpt2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, accum=1, compile=False,
                    dtype="bfloat16")
        return [dict(gpt2, micro_batch=m) for m in ([16] if quick else [16, 64])]
    baby = dict(n_layer=1, n_head=2, n_embd=64, block_size=256, micro_batch=8, accum=2,
                chunk_rows=512)
    return [dict(baby, compile=False, dtype="float32"), dict(baby, compile=True, dtype="bfloat16")]


class PeakRSS(threading.Thread):
    """This process's highest resident memory while it runs (bytes), sampled."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.page, self.peak, self.done = os.sysconf("SC_PAGE_SIZE"), 0, threading.Event()

    def rss(self) -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * self.page

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.0005)


def _nanogpt_model(shape: dict[str, int]):
    spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.GPTConfig(n_layer=shape["n_layer"], n_head=shape["n_head"],
                              n_embd=shape["n_embd"], block_size=shape["block_size"],
                              vocab_size=50304, dropout=0.0, bias=False)
    return module.GPT(config)


def measure(case: str, shape: dict[str, Any], device: str) -> dict[str, Any]:
    """One case in this process: the peak bytes of two optimizer steps above what it held."""
    import torch

    from gpt.models import loss
    from gpt.models.model import GPT, GPTConfig

    torch.manual_seed(0)
    cuda = device == "cuda"
    if not cuda:
        loss.CHUNK_BYTES = shape["chunk_rows"] * 50304 * 4
    if case == "nanoGPT":
        model = _nanogpt_model(shape)
    else:
        model = GPT(GPTConfig(vocab_size=VOCAB, dropout=0.0, bias=False, spelling=0,
                              **{k: shape[k] for k in ("n_layer", "n_head", "n_embd",
                                                       "block_size")}))
        model.chunked_loss = case == "ours, chunked loss"
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    training_model = torch.compile(model) if shape["compile"] else model
    bf16 = shape["dtype"] == "bfloat16"
    B, T, accum = shape["micro_batch"], shape["block_size"], shape["accum"]
    batches = torch.randint(0, VOCAB, (3, accum, 2, B, T), device=device)

    def step(micro_steps: torch.Tensor) -> None:
        logits = None
        for x, y in micro_steps:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                if case == "nanoGPT":  # train.py: `logits, loss = model(X, Y)`, kept
                    logits, loss = training_model(x, y)
                else:  # train-gpt: `loss = self.training_model(x, y, ...)[1]`
                    loss = training_model(x, y)[1]
            (loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits

    step(batches[0])  # compiles, allocates AdamW's state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        sampler = PeakRSS()
        before = sampler.rss()
        sampler.start()
    step(batches[1])
    step(batches[2])
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        sampler.done.set()
        sampler.join()
        peak = sampler.peak - before
    return {"peak_bytes": peak, "logits_bytes": B * T * 50304 * 4}


def run(quick: bool) -> Result:
    import torch

    require_nanogpt()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    result = Result("step_memory",
                    {"device": device, "shapes": shapes(cuda, quick),
                     "device_name": torch.cuda.get_device_name() if cuda else "cpu"},
                    ["case", "micro-batch", "mode", "peak", "float32 (B, T, V) tensors"])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for shape in shapes(cuda, quick):
        for case in CASES:
            mode = f"{'compiled' if shape['compile'] else 'eager'}, {shape['dtype']}"
            print(f"step_memory: {case}, {shape['micro_batch']} x {shape['block_size']}, "
                  f"{mode} ...", flush=True)
            out = subprocess.run([sys.executable, "-m", "bench.step_memory", case,
                                  json.dumps(shape), device],
                                 capture_output=True, text=True, env=env, cwd=REPO)
            if out.returncode:
                raise RuntimeError(f"step_memory {case}: {out.stderr.strip()[-2000:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            result.rows.append({
                "case": case, "micro-batch": f"{shape['micro_batch']} x {shape['block_size']}",
                "mode": mode, "peak": f"{got['peak_bytes'] / 2**30:.2f} GiB",
                "float32 (B, T, V) tensors": f"{got['peak_bytes'] / got['logits_bytes']:.2f}",
                **got, "shape": shape,
            })  # fmt: skip
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one case of the step_memory benchmark")
    parser.add_argument("case", choices=CASES)
    parser.add_argument("shape", type=json.loads)
    parser.add_argument("device")
    args = parser.parse_args()
    print(json.dumps(measure(args.case, args.shape, args.device)))
