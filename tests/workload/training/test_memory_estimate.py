"""train-gpt's memory estimate (gpt/training/memory_estimate.py): what it counts, the memory it
compares with (a GPU's free memory, a CPU container's limit), and a refusal that names the
cheapest change that fits; held against a measured peak (bench/memory_peaks.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.runs import TINY_TWO_BLOCKS

from gpt.config.configs import GPTConfig, TrainConfig
from gpt.distributed.world import World
from gpt.errors import InputError
from gpt.memory import memory_limit, usable_memory
from gpt.models.model import GPT
from gpt.training import memory_estimate
from gpt.training.memory_estimate import GiB, Plan, cheapest_fit, check_memory, estimate

MEDIUM = dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50257)


def _meta_gpt(**shape) -> GPT:
    with torch.device("meta"):  # shapes only: GPT-2's sizes in no memory
        return GPT(GPTConfig(**shape))


def test_the_estimate_counts_state_activations_and_logits_by_their_rules():
    """GPT-2 medium, 8 sequences of 1,024 on CUDA in bf16: float32 weights and autocast's
    bf16 copies, float32 gradients and two AdamW moments, 62 x tokens x width bytes of
    activations per layer (checkpointed: each layer's float32 input and one layer's), and
    three float32 logits where the loss is not chunked."""
    model = _meta_gpt(**MEDIUM)
    params = sum(p.numel() for p in model.parameters())
    tokens = 8 * 1024
    plain = estimate(model, Plan(8, 1, False), bf16=True, chunked_loss=True, cuda=True)
    assert (plain.weights, plain.gradients, plain.optimizer) == (6 * params, 4 * params,
                                                                  8 * params)  # fmt: skip
    assert plain.activations == 24 * tokens * 62 * 1024 and plain.logits == 0
    checkpointed = estimate(model, Plan(8, 1, True), bf16=True, chunked_loss=True, cuda=True)
    assert checkpointed.activations == 24 * 4 * tokens * 1024 + tokens * 62 * 1024
    assert checkpointed.activations < plain.activations / 8
    whole = estimate(model, Plan(8, 1, False), bf16=False, chunked_loss=False, cuda=True)
    assert whole.weights == 4 * params and whole.logits == 3 * 4 * tokens * 50257
    assert whole.total == sum(dataclasses.astuple(whole))


def test_frozen_weights_cost_their_weights_alone():
    model = _meta_gpt(**TINY_TWO_BLOCKS)
    full = estimate(model, Plan(4, 1, False), bf16=False, chunked_loss=True, cuda=False)
    for p in model.transformer.h.parameters():
        p.requires_grad_(False)
    frozen = sum(p.numel() for p in model.transformer.h.parameters())
    part = estimate(model, Plan(4, 1, False), bf16=False, chunked_loss=True, cuda=False)
    assert part.weights == full.weights
    assert (full.gradients - part.gradients, full.optimizer - part.optimizer) == (4 * frozen,
                                                                                  8 * frozen)


def test_sharded_a_rank_holds_its_share_and_a_few_units_whole():
    """Over 8 ranks: an eighth of the weights, gradients and AdamW's moments, plus the root
    unit whole (weights and gradients) and two blocks' weights and one block's gradients;
    the activations are a rank's own either way; a weight average is one more copy."""
    model = _meta_gpt(**MEDIUM)
    params = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    root = params - 24 * block
    whole = estimate(model, Plan(8, 1, False), bf16=False, chunked_loss=True, cuda=True)
    sharded = estimate(model, Plan(8, 1, False, shards=8), bf16=False, chunked_loss=True,
                       cuda=True)  # fmt: skip
    assert sharded.weights == 4 * params // 8 + 4 * (root + 2 * block)
    assert sharded.gradients == 4 * params // 8 + 4 * (root + block)
    assert sharded.optimizer == 8 * params // 8
    assert sharded.activations == whole.activations
    state = sharded.weights + sharded.gradients + sharded.optimizer
    assert state < (whole.weights + whole.gradients + whole.optimizer) / 4
    averaged = estimate(model, Plan(8, 1, False, average=True), False, True, True)
    assert averaged.weights == whole.weights + 4 * params


def test_a_plan_for_adapters_counts_them_on_every_projection_lora_may_target():
    model = _meta_gpt(**MEDIUM)
    params = sum(p.numel() for p in model.parameters())
    adapters = 24 * 16 * (4 + 2 + 5 + 5) * 1024  # r x (in + out) of c_attn, c_proj, c_fc, c_proj
    lora = estimate(model, Plan(8, 1, False, lora_rank=16), True, True, True)
    assert (lora.gradients, lora.optimizer) == (4 * adapters, 8 * adapters)
    assert lora.weights == 6 * (params + adapters)
    averaged = estimate(model, Plan(8, 1, False, average=True, lora_rank=16), True, True, True)
    assert averaged.weights == lora.weights + 4 * adapters  # the average holds the adapters


def test_a_fine_tuning_run_is_told_of_lora_only_where_nothing_else_fits(monkeypatch):
    model = _meta_gpt(**MEDIUM)
    lora = estimate(model, Plan(1, 16, True, lora_rank=16), True, True, cuda=False).total
    full = estimate(model, Plan(1, 16, True), True, True, cuda=False).total
    assert lora < full
    monkeypatch.setattr(memory_estimate, "available_memory",
                        lambda device: (lora, "cuda:0 has some GiB free"))
    cfg = TrainConfig(batch_size=16, block_size=1024, dtype="bfloat16", chunked_loss=True,
                      init_from="gpt2")
    with pytest.raises(InputError) as e:
        check_memory(model, cfg, World(), 16, lambda line: None)
    assert str(e.value).endswith("the cheapest change that fits: --grad_accum 16 "
                                 f"--activation_checkpointing true --lora_rank 16 "
                                 f"({lora / GiB:.1f} GiB)")
    monkeypatch.setattr(memory_estimate, "available_memory", lambda device: (1 << 20, "tiny"))
    with pytest.raises(InputError) as e:
        check_memory(model, cfg, World(), 16, lambda line: None)
    assert str(e.value).endswith("no --grad_accum, --activation_checkpointing or --lora_rank "
                                 "fits: take a smaller model or a device with more memory")


def test_several_ranks_make_shard_an_option_and_its_flags_are_named():
    model = _meta_gpt(**MEDIUM)
    plan = Plan(1, 8, False)  # the state is most of it: only sharding cuts enough
    sharded = estimate(model, Plan(1, 8, False, shards=4), True, True, True).total
    assert cheapest_fit(model, plan, 4, sharded, True, True, True)[0] == "--shard true"
    assert cheapest_fit(model, plan, 1, sharded, True, True, True) is None  # one rank
    assert Plan(1, 32, True, shards=4).flags(plan) == (
        "--grad_accum 32 --activation_checkpointing true --shard true")


def test_the_cheapest_change_that_fits_is_named():
    """Smaller micro-batches keep a GPU busy down to BUSY_TOKENS a micro-batch, so they come
    first; below that, checkpointing (a third more compute) is quicker than splitting further."""
    model = _meta_gpt(**MEDIUM)
    plan = Plan(16, 1, False)

    def need(micro_batch: int, checkpointed: bool) -> int:
        return estimate(model, Plan(micro_batch, 16 // micro_batch, checkpointed), True, True,
                        True).total  # fmt: skip

    assert cheapest_fit(model, plan, 1, need(16, False), True, True, True)[0] == "--grad_accum 2"
    assert cheapest_fit(model, plan, 1, need(8, False), True, True, True)[0] == "--grad_accum 2"
    assert cheapest_fit(model, plan, 1, need(4, False), True, True, True)[0] == "--grad_accum 4"
    # micro-batch 1 would fit too, at 4x the time of a busy one; checkpointing costs 4/3, and
    # fits at micro-batch 8 already
    assert (cheapest_fit(model, plan, 1, need(1, False) + 1, True, True, True)[0]
            == "--grad_accum 2 --activation_checkpointing true")
    assert cheapest_fit(model, plan, 1, need(1, True) - 1, True, True, True) is None


def test_a_run_that_cannot_fit_is_refused_in_one_line_naming_the_fit(monkeypatch):
    model = _meta_gpt(**MEDIUM)
    cfg = TrainConfig(batch_size=16, block_size=1024, dtype="bfloat16", chunked_loss=True)
    fits = estimate(model, Plan(4, 4, False), True, True, False).total
    monkeypatch.setattr(memory_estimate, "available_memory",
                        lambda device: (fits, f"the cpu has {fits / GiB:.1f} GiB"))
    said = []
    with pytest.raises(InputError) as e:
        check_memory(model, cfg, World(), 16, said.append)
    line = str(e.value)
    need = estimate(model, Plan(16, 1, False), True, True, False)
    assert "\n" not in line and line.startswith(
        f"353.50M parameters need about {need.total / GiB:.1f} GiB per device to train (full "
        f"training, micro-batch 16: weights 1.98, gradients 1.32, AdamW 2.63, activations ")
    assert f") and the cpu has {fits / GiB:.1f} GiB; " in line
    assert line.endswith(f"the cheapest change that fits: --grad_accum 4 ({fits / GiB:.1f} GiB)")
    assert said == [f"memory: {need.describe()} for full training, micro-batch 16; the cpu has "
                    f"{fits / GiB:.1f} GiB"]
    said.clear()
    check_memory(model, dataclasses.replace(cfg, grad_accum=4), World(), 4, said.append)
    assert len(said) == 1 and said[0].startswith("memory: about ")


@pytest.mark.parametrize("files, limit", [
    ({"memory.max": "max\n"}, None),
    ({"memory.max": "2147483648\n"}, 2 * GiB),
    ({"memory/memory.limit_in_bytes": "1073741824\n"}, GiB),
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1's "unlimited"
    ({}, None),
])  # fmt: skip
def test_a_containers_memory_limit_is_read_from_its_cgroup(tmp_path, files, limit):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert memory_limit(tmp_path) == limit
    assert usable_memory(tmp_path) == (limit or usable_memory(tmp_path / "none"))
    assert usable_memory(tmp_path / "none") > 0  # the machine's RAM


@pytest.mark.process
@pytest.mark.slow
def test_the_estimate_is_near_a_measured_peak():
    """A CPU training 4 x 256 at 8 x 256 tokens: peak resident memory over two iterations in a
    process of its own (bench/memory_peaks.py), the estimate within 15% of it."""
    from bench.memory_peaks import case

    row = case("4 x 256, 8 x 256", "full")
    assert 0.85 <= row["estimate_bytes"] / row["peak_bytes"] <= 1.15, row
