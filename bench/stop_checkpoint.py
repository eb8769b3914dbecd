"""Stop checkpoint: how long the checkpoint a SIGTERM writes takes, for the default model and for
GPT-2 124M, on this machine's CPU and disk.

A deletion (a drain, a preemption, KFP's Terminate) gives train-gpt the pod's grace period: the
end of the step it is in, then `checkpoint_files.save` (weights, AdamW's two moments, RNG states,
all fsynced), must fit in it (runtimes/gpt-train-gpt.yaml: terminationGracePeriodSeconds 120,
torchrun's shutdown timeout 100 s). This times `checkpoint_files.save` itself, after one
optimizer step so the optimizer state is full size. A PVC's write bandwidth differs from this
disk's: the MB/s column says what to compare with.
"""

from __future__ import annotations

import tempfile

from bench.harness import Result, Stats, fmt_stats, repeat, timed
from gpt.config.configs import GPTConfig, TrainConfig
from gpt.training.recipe import finish

# The default model's vocabulary: the compacted GPT-2 tokenizer on the embedded corpus is at most
# max_vocab (8192) ids; its training split is 25,648 tokens.
MODELS = {
    "default (4 x 128)": finish(TrainConfig(), 8192, train_tokens=25_648).model,
    "GPT-2 124M (12 x 768)": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024,
                                       vocab_size=50257, dropout=0.0),  # fmt: skip
}


def _trained(config: GPTConfig):
    """The model and an AdamW after one step: every moment tensor exists."""
    import torch

    from gpt.models.model import GPT
    from gpt.training.optimizer import build_optimizer

    torch.manual_seed(0)
    model = GPT(config)
    cfg = finish(TrainConfig(), config.vocab_size, train_tokens=25_648).config
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    x = torch.randint(0, config.vocab_size, (1, 64))
    _, loss = model(x, x)
    loss.backward()
    optimizer.step()
    return model, optimizer


def _save_seconds(config: GPTConfig, repeats: int) -> tuple[Stats, int, int]:
    """Seconds per `checkpoint_files.save` of a model of `config`, its bytes and parameters."""
    from gpt.rundir.layout import RunDir
    from gpt.training import checkpoint_files

    model, optimizer = _trained(config)
    state = checkpoint_files.CheckpointState(checkpoint_files.TrainState(), config,
                                             ema_decay=0.0, data={}, config={}, world_size=1)
    with tempfile.TemporaryDirectory() as root:
        rundir = RunDir.of(root, "bench")
        steps = iter(range(1, 1000))

        def save() -> None:
            checkpoint_files.save(rundir, next(steps), model, optimizer, state, [], keep_last=1)

        seconds = repeat(lambda: timed(save), warmup=1, repeats=repeats)
        size = sum(f.stat().st_size for f in rundir.ckpt_dir.rglob("*") if f.is_file())
    return seconds, size, sum(p.numel() for p in model.parameters())


def run(quick: bool) -> Result:
    repeats = 1 if quick else 3
    result = Result("stop_checkpoint", {"repeats": repeats, "warmup": 1, "device": "cpu"},
                    ["model", "parameters", "checkpoint", "save", "MB/s"])  # fmt: skip
    for name, config in MODELS.items():
        seconds, size, params = _save_seconds(config, repeats)
        result.rows.append({
            "model": name,
            "parameters": f"{params / 1e6:.1f} M",
            "checkpoint": f"{size / 1e6:.0f} MB",
            "save": fmt_stats(seconds, " s"),
            "MB/s": f"{size / 1e6 / seconds.median:.0f}",
            "save_s": seconds.as_dict(),
            "bytes": size,
        })  # fmt: skip
    return result
