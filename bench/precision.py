"""bfloat16 against float32, and the chunked loss against the whole logits: the first 50
training losses of one model, trained each way.

On a GPU the trainer runs its passes in bfloat16 autocast and computes the loss in chunks
(`--chunked_loss`) by default. A precision problem shows first at the start of training, so this
trains the same model, seed and batches with `--dtype float32` and with `--dtype bfloat16`, the
latter with the whole logits and with the chunked loss, for 50 steps, logging every step, and
reports the largest relative gap of each loss curve to float32's (the goal: under 2%) and to
the whole logits' in bfloat16 (the chunked loss's goal: under 1%). On CUDA also with the fused
loss (`--fused_loss`, a Triton kernel: `ways`). On CUDA it is vs_nanogpt's
GPT-2 124M shape on the plays (uncompiled: compiling changes what runs, not what it computes);
on a CPU the baby GPT, where bfloat16 autocast is slower, but computes the same.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from bench import vs_nanogpt
from bench.harness import Result

STEPS = 50
# Each way: its name, and its flags. float32 with its device's default loss.
WAYS = {
    "float32": {"dtype": "float32"},
    "bfloat16, whole logits": {"dtype": "bfloat16", "chunked_loss": False},
    "bfloat16, chunked loss": {"dtype": "bfloat16", "chunked_loss": True},
}
# On CUDA only (a Triton kernel): the chunked loss's cross-entropy in one kernel (--fused_loss).
FUSED = {"bfloat16, fused loss": {"dtype": "bfloat16", "fused_loss": True}}


def ways(cuda: bool, quick: bool) -> dict[str, dict]:
    """WAYS, with FUSED on CUDA; a quick run on CUDA without the whole logits, whose curve
    bench/speed_trials.md has (27 Nov, H200: 0.60% from float32): three runs, about 150 s."""
    if not cuda:
        return WAYS
    found = {**WAYS, **FUSED}
    if quick:
        del found["bfloat16, whole logits"]
    return found


def largest_gap(reference: list[float], curve: list[float]) -> float:
    return max(abs(b - a) / a for a, b in zip(reference, curve, strict=True))


def loss_curve(root: Path, run: str) -> list[float]:
    from gpt.rundir.layout import RunDir
    from gpt.training.report import read_jsonl

    return [row["loss"] for row in read_jsonl(RunDir.of(root, run).train_jsonl) if "loss" in row]


def run(quick: bool) -> Result:
    import torch

    cuda = torch.cuda.is_available()
    shape = vs_nanogpt.shape_for(cuda, quick)
    micro_batch = min(16, shape.sequences())
    result = Result(
        "precision",
        {"steps": STEPS, "shape": vars(shape), "micro_batch": micro_batch,
         "device_name": torch.cuda.get_device_name() if cuda else "cpu"},
        ["way", "loss at step 1", f"loss at step {STEPS}", "largest gap to float32",
         "largest gap to the whole logits"],
    )
    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:
        root = Path(tmp)
        data_run, _ = vs_nanogpt.prepare_data(shape, root, quick)
        curves = {}
        for i, (way, way_flags) in enumerate(ways(cuda, quick).items()):
            flags = {**way_flags, "compile": False, "max_iters": STEPS, "log_interval": 1,
                     "warmup_iters": 10}  # at the peak learning rate for most of the steps
            case = vs_nanogpt.Case("ours", way, micro_batch, flags)
            run_name = vs_nanogpt.linked_run(root, data_run, f"way-{i}")
            print(f"precision: {way} ...", flush=True)
            argv = vs_nanogpt.ours_command(shape, case, root, run_name)
            out = subprocess.run(argv, cwd=vs_nanogpt.REPO, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"{way} run failed: {out.stderr.strip()[-2000:]}")
            curves[way] = loss_curve(root, run_name)
    whole = curves.get("bfloat16, whole logits")
    for way, curve in curves.items():
        gap = largest_gap(curves["float32"], curve)
        gap_whole = largest_gap(whole, curve) if whole else None
        result.rows.append({
            "way": way, "loss at step 1": f"{curve[0]:.4f}",
            f"loss at step {STEPS}": f"{curve[-1]:.4f}", "largest gap to float32": f"{gap:.2%}",
            "largest gap to the whole logits": f"{gap_whole:.2%}" if whole else "n/a",
            "largest_gap": gap, "largest_gap_to_whole": gap_whole, "losses": curve,
        })  # fmt: skip
    return result
