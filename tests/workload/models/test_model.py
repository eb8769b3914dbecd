"""The GPT model: shapes, causality, KV cache equivalence, config validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from support.runs import TINY_MODEL

from gpt.config.configs import SamplingConfig
from gpt.generation.sampling import generate, new_generator
from gpt.models import loss as chunked
from gpt.models.model import (
    GPT,
    Dropout,
    GPTConfig,
    ReLUSquared,
    Rotary,
    apply_rotary,
    causal_attention,
    dropout_mask,
)
from gpt.models.spelling import spell
from gpt.tokenizer.kinds import CharTokenizer

# The tiny model with two blocks (so that what passes from one block to the next is checked too),
# over 67 ids (not a multiple of 64: the embedding is padded).
MODEL = {**TINY_MODEL, "n_layer": 2, "vocab_size": 67}


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**MODEL)).eval()


def test_logits_and_loss_shapes(model: GPT) -> None:
    idx, targets = torch.randint(0, 67, (2, 3, 10))
    logits, loss = model(idx, targets=targets)
    assert logits.shape == (3, 10, 67)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # an untrained model is close to uniform: loss near ln(vocab) on targets unrelated to idx
    assert abs(loss.item() - torch.log(torch.tensor(67.0)).item()) < 0.5


def test_future_tokens_do_not_change_past_logits(model: GPT) -> None:
    idx = torch.randint(0, 67, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 67
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_kv_cache_logits_equal_full_forward(model: GPT) -> None:
    idx = torch.randint(0, 67, (2, 16))
    full, _ = model(idx)
    cache = model.new_cache(batch_size=2)
    prefill, _ = model(idx[:, :9], cache=cache)  # prefill 9 tokens
    steps = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(9, 13)]  # decode 4, one by one
    chunk, _ = model(idx[:, 13:], cache=cache)  # then 3 at once at an offset
    cached = torch.cat([prefill, *steps, chunk], dim=1)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)
    assert cache.pos == 16


def test_cache_refuses_to_overflow_the_context(model: GPT) -> None:
    cache = model.new_cache()
    model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_rotary_scores_depend_only_on_the_distance_between_tokens() -> None:
    torch.manual_seed(0)
    rotary = Rotary(head_dim=8, block_size=32)
    q, k = torch.randn(2, 1, 1, 1, 8).unbind(0)  # (B, T, nh, hs) each

    def score(m: int, n: int) -> torch.Tensor:
        return (apply_rotary(q, *rotary(m, 1)) * apply_rotary(k, *rotary(n, 1))).sum()

    torch.testing.assert_close(score(5, 2), score(25, 22))
    torch.testing.assert_close(score(3, 3), (q * k).sum())  # same position: plain dot product
    assert not torch.allclose(score(5, 2), score(5, 4))
    torch.testing.assert_close(apply_rotary(q, *rotary(7, 1)).norm(), q.norm())  # a rotation
    # A whole window at once: position t of every head is rotated as position t alone is.
    window = apply_rotary(q.expand(2, 32, 3, 8), *rotary(0, 32))  # (B, T, nh, hs)
    for t in (0, 7, 31):
        torch.testing.assert_close(window[:, t], apply_rotary(q, *rotary(t, 1))[0].expand(2, 3, 8))


def test_squared_relu_has_the_gradient_of_relu_squared() -> None:
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ReLUSquared.apply, (x,))
    out, = torch.autograd.grad(ReLUSquared.apply(x).sum(), x)
    want, = torch.autograd.grad(F.relu(x).square().sum(), x)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.05])
def test_the_cpu_dropout_mask_drops_each_element_with_probability_p(p: float) -> None:
    torch.manual_seed(0)
    mask = dropout_mask(torch.empty(1000, 1001), p)  # not a multiple of the 4 elements per draw
    assert mask.shape == (1000, 1001)
    dropped = mask == 0
    torch.testing.assert_close(mask[~dropped], torch.full_like(mask[~dropped], 1 / (1 - p)),
                               rtol=1e-4, atol=0)  # p rounds to a multiple of 1/65536
    # Each of the four elements one 64-bit draw makes, on its own: PyTorch's plain random_()
    # leaves an int64's sign bit 0, which would never drop the fourth.
    lanes = dropped.flatten()[: 1000 * 1000].view(-1, 4).float().mean(dim=0)
    assert (lanes - p).abs().max() < 0.005, lanes  # 5 standard deviations at p = 0.5
    assert abs(mask.mean().item() - 1.0) < 0.01  # the expectation is kept
    torch.manual_seed(0)
    assert torch.equal(dropout_mask(torch.empty(1000, 1001), p), mask)  # the seed decides it
    assert not torch.equal(dropout_mask(torch.empty(1000, 1001), p), mask)  # a fresh one each


def test_dropout_is_the_identity_but_while_training() -> None:
    x = torch.randn(8, 16, requires_grad=True)
    drop = Dropout(0.2)
    assert drop.eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    torch.manual_seed(3)
    y = drop.train()(x)
    torch.manual_seed(3)
    mask = dropout_mask(x, 0.2)
    assert torch.equal(y, x * mask) and (mask == 0).any()
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(grad, mask)  # a dropped element gets no gradient


def test_causal_attention_with_cpu_dropout_drops_attention_weights() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 8, 16, dtype=torch.float64).unbind(0)  # (B, nh, T, hs)
    torch.manual_seed(1)
    out = causal_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(1)
    mask = dropout_mask(torch.empty(2, 4, 8, 8, dtype=torch.float64), 0.3)  # the same draw
    scores = (q @ k.transpose(-2, -1)) / 4.0  # sqrt(hs)
    future = torch.arange(8)[None, :] > torch.arange(8)[:, None]  # key after query
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    torch.testing.assert_close(out, (weights * mask) @ v)
    # Without dropout it is the fused kernel's attention; a dropped weight changes the output.
    plain = causal_attention(q, k, v, dropout_p=0.0)
    torch.testing.assert_close(plain, weights @ v)
    assert not torch.allclose(out, plain)


def test_the_order_of_the_context_reaches_the_model(model: GPT) -> None:
    # Without positions, causal attention sums over the earlier tokens in any order, so the last
    # position could not tell "a b c" from "b a c". The model has no learned position table.
    a, _ = model(torch.tensor([[5, 9, 3]]))
    b, _ = model(torch.tensor([[9, 5, 3]]))
    assert not torch.allclose(a[0, -1], b[0, -1])
    assert not any("wpe" in name for name in model.state_dict())


def test_bf16_autocast_forward_and_cache(model: GPT) -> None:
    idx = torch.randint(0, 67, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full, loss = model(idx, targets=idx)
        cache = model.new_cache(batch_size=2)
        model(idx[:, :11], cache=cache)
        last, _ = model(idx[:, 11:], cache=cache)
    assert torch.isfinite(loss)
    torch.testing.assert_close(last[:, 0].float(), full[:, -1].float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("position, activation", [("learned", "gelu"), ("rope", "gelu"),
                                                  ("learned", "relu2")])
def test_gpt2_choices_build_and_cache_like_the_defaults(position: str, activation: str) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(**{**MODEL, "position": position, "activation": activation})
    model = GPT(cfg).eval()
    assert ("transformer.wpe.weight" in model.state_dict()) == (position == "learned")
    idx = torch.randint(0, 67, (1, 16))
    full, _ = model(idx)
    cache = model.new_cache()
    cached = torch.cat([model(idx[:, :10], cache=cache)[0], model(idx[:, 10:], cache=cache)[0]], 1)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)
    # An odd head size is fine without rotary pairs.
    GPTConfig(**{**MODEL, "n_embd": 30, "n_head": 2, "position": "learned"})


def test_output_head_is_tied_to_token_embedding(model: GPT) -> None:
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


@pytest.mark.parametrize(
    "override, flag",
    [
        (dict(n_embd=30, n_head=4), "--n_embd"),
        (dict(n_embd=30, n_head=2), "the head size must be even"),
        (dict(position="alibi"), "--position 'alibi': expected rope or learned"),
        (dict(activation="swish"), "--activation 'swish': expected relu2, gelu or gelu_new"),
        (dict(n_layer=0), "--n_layer"),
        (dict(block_size=-1), "--block_size"),
        (dict(dropout=1.0), "--dropout"),
        (dict(dropout=-0.1), "--dropout"),
        (dict(vocab_size=2.5), "--vocab_size"),
    ],
)
def test_config_validation_names_the_flag(override: dict, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        GPTConfig(**{**MODEL, **override})


def test_vocabulary_is_padded_inside_the_model_only(model: GPT) -> None:
    """67 ids get 128 rows (a multiple of 64, for GPU tiles), but the model is the unpadded one:
    logits only for the 67, a loss over the 67 alone, no gradient into the padding rows."""
    assert model.lm_head.weight.shape == (128, 32)
    assert "vocab 67 (padded to 128)" in model.describe()
    idx, targets = torch.randint(0, 67, (2, 3, 10))
    model.train()
    logits, loss = model(idx, targets=targets)
    assert logits.shape == (3, 10, 67)
    real_only = F.cross_entropy(logits.reshape(-1, 67), targets.reshape(-1))
    torch.testing.assert_close(loss, real_only)
    loss.backward()
    assert model.lm_head.weight.grad[:67].abs().sum() > 0
    assert torch.count_nonzero(model.lm_head.weight.grad[67:]) == 0


def test_padding_ids_are_never_sampled(model: GPT) -> None:
    """Padding rows made to outscore every real id still never come out of generate."""
    with torch.no_grad():
        model.lm_head.weight[67:] = model.lm_head.weight[:61] * 1000
    cfg = SamplingConfig(temperature=2.0, max_new_tokens=200)
    ids = list(generate(model, [1, 2, 3], cfg, new_generator(0)))
    assert len(ids) == 200 and max(ids) < 67


def test_export_round_trip_keeps_the_model_and_leaves_out_padding(tmp_path, model: GPT) -> None:
    from gpt.models.export import load_export, save_export

    save_export(model, CharTokenizer("ab"), tmp_path / "model")
    stored = load_file(tmp_path / "model" / "model.safetensors")
    assert stored["gpt_neox.embed_in.weight"].shape == (67, 32) and "lm_head.weight" not in stored
    loaded, tok = load_export(tmp_path / "model")
    assert tok.to_json() == CharTokenizer("ab").to_json()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                                 strict=True):
        torch.testing.assert_close(a[:67], b[:67], msg=name)  # the real rows; all of the rest
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    idx = torch.randint(0, 67, (2, 16))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0])


def test_export_of_another_shape_gets_one_line(tmp_path, model: GPT) -> None:
    import json

    from gpt.errors import InputError
    from gpt.models.export import load_export, save_export

    save_export(model, CharTokenizer("ab"), tmp_path / "model")
    config = tmp_path / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 70}))
    with pytest.raises(InputError, match=r"transformer.wte.weight is \(67, 32\), expected "
                                         r"\(70, 32\) \(1 tensor\(s\) differ\)$"):
        load_export(tmp_path / "model")


def test_export_refuses_a_pickle_in_place_of_safetensors(tmp_path, monkeypatch, model: GPT) -> None:
    import pickle

    from gpt.errors import InputError
    from gpt.models.export import load_export, save_export

    monkeypatch.chdir(tmp_path)  # where the payload would write if it ever ran
    save_export(model, CharTokenizer("ab"), tmp_path / "model")

    class Evil:
        def __reduce__(self):
            return (exec, ("open('pwned', 'w').write('x')",))

    (tmp_path / "model" / "model.safetensors").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(InputError, match="not a valid safetensors model"):
        load_export(tmp_path / "model")
    assert not (tmp_path / "pwned").exists()


def _loss_and_grads(model: GPT, idx, targets, embedding=None):
    model.zero_grad()
    logits, loss = model(idx, targets=targets, embedding=embedding)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("spelled", [False, True])
def test_the_chunked_loss_trains_as_the_whole_logits_do(spelled: bool, monkeypatch) -> None:
    """The loss GPU runs take (`chunked_loss`, default on CUDA): no logits, the same loss and
    gradients (to 1e-6) in every parameter, the padding rows' included (zero), in chunks of 7
    positions (30 positions: 5 chunks), for a plain and for a spelled embedding."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 7 * 128 * 4)  # 7 rows of 128 padded ids
    torch.manual_seed(0)
    config = GPTConfig(**{**MODEL, "spelling": 2 if spelled else 0})
    vocab = [bytes([65 + i % 26, 97 + i // 26]) for i in range(67)]  # pairs share n-grams
    spelling = spell(vocab, 2) if spelled else None
    model = GPT(config, spelling).train()
    assert model.chunked_loss is False  # the default: the whole logits
    idx, targets = torch.randint(0, 67, (2, 3, 10))
    logits, loss, grads = _loss_and_grads(model, idx, targets)
    assert logits.shape == (3, 10, 67)
    model.chunked_loss = True
    none, chunked_loss, chunked_grads = _loss_and_grads(model, idx, targets)
    assert none is None
    torch.testing.assert_close(chunked_loss, loss, atol=1e-6, rtol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=1e-6, rtol=1e-6, msg=name)
    assert torch.count_nonzero(model.lm_head.weight.grad[67:]) == 0
    with torch.no_grad():  # evaluation's loss alike
        torch.testing.assert_close(model(idx, targets=targets)[1], loss, atol=1e-6, rtol=1e-6)


def test_a_table_built_by_the_caller_is_the_one_built_inside(model: GPT) -> None:
    """`embedding=`: what train-gpt passes, built once per step; the same logits and loss."""
    idx, targets = torch.randint(0, 67, (2, 3, 10))
    inside = model(idx, targets=targets)
    given = model(idx, targets=targets, embedding=model.embedding())
    assert torch.equal(inside[0], given[0]) and torch.equal(inside[1], given[1])
