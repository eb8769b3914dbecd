"""Our GPT as an architecture transformers already knows: the mapping both ways.

Every model `gpt/models/model.py` builds is one transformers loads with no custom code:
- rotary positions (the default): GPT-NeoX, `rotary_pct` 1 (every dimension of a head turns,
  in halves, as `apply_rotary` does), `use_parallel_residual` False (attention, then the MLP,
  each on its own LayerNorm, as our Block), the queries, keys and values regrouped per head;
- learned positions: GPT-2, its `Conv1D` weights the transpose of our `nn.Linear`s.
squared ReLU is transformers' `relu2`, GELU its exact `gelu`, GPT-2's tanh-approximated GELU its
`gelu_new` (`gelu_pytorch_tanh`, the same function, reads as it). Without `bias` the exported bias
tensors are zeros, which both architectures always have; the embedding, which is also the output
head, is tied in both and written once, without our padding rows.

This module knows names, shapes and config keys only: it needs neither transformers nor a model
instance, so our own CLI reads an export without importing transformers.
"""

from __future__ import annotations

from typing import Any

import torch

from gpt.config.configs import GPTConfig

# transformers' names for our activations (transformers.activations.ACT2FN).
ACTIVATIONS = {"relu2": "relu2", "gelu": "gelu", "gelu_new": "gelu_new"}
SAME_ACTIVATION = {"gelu_pytorch_tanh": "gelu_new"}  # other names transformers has for ours
# GPT-2 saved by its base model (the Hub's openai-community/gpt2*) names tensors without the
# `transformer.` prefix, and older checkpoints hold the attention mask buffers as tensors.
GPT2_PREFIX = "transformer."
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")
ROPE_THETA = 10000.0  # gpt/models/model.py Rotary's base
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which gpt/models/model.py keeps
EMBEDDINGS = ("transformer.wte", "transformer.wpe")
LINEARS = ("c_attn", "c_proj", "c_fc")  # GPT-2 holds these as Conv1D


# transformers' `model_type` of each architecture: the key its Auto classes dispatch on.
MODEL_TYPES = {"GPTNeoXForCausalLM": "gpt_neox", "GPT2LMHeadModel": "gpt2"}


def architecture(config: GPTConfig) -> str:
    """The transformers class that holds this model."""
    return "GPTNeoXForCausalLM" if config.position == "rope" else "GPT2LMHeadModel"


def config_json(config: GPTConfig, eot_id: int | None) -> dict[str, Any]:
    """`config.json` of the architecture: the keys of transformers' GPTNeoXConfig or GPT2Config
    that describe our model; every other key loads as the class's default, which is what
    `save_pretrained` would have written for it. (No `transformers_version`: it names the
    writer, and the writer is not transformers.)"""
    arch = architecture(config)
    return {"architectures": [arch], "model_type": MODEL_TYPES[arch], "dtype": "float32",
            **_config_keys(config, eot_id)}  # fmt: skip


def _config_keys(config: GPTConfig, eot_id: int | None) -> dict[str, Any]:
    """The keys of the architecture's config that describe our model."""
    special = {"bos_token_id": eot_id, "eos_token_id": eot_id}
    if config.position == "rope":
        return dict(
            vocab_size=config.vocab_size,
            hidden_size=config.n_embd,
            num_hidden_layers=config.n_layer,
            num_attention_heads=config.n_head,
            intermediate_size=4 * config.n_embd,
            hidden_act=ACTIVATIONS[config.activation],
            max_position_embeddings=config.block_size,
            rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                             "partial_rotary_factor": 1.0},  # fmt: skip
            use_parallel_residual=False,
            attention_bias=True,  # the MLP and LayerNorms have biases in GPT-NeoX regardless
            layer_norm_eps=LAYER_NORM_EPS,
            hidden_dropout=config.dropout,
            attention_dropout=config.dropout,
            tie_word_embeddings=True,
            **special,
        )
    return dict(
        vocab_size=config.vocab_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_positions=config.block_size,
        activation_function=ACTIVATIONS[config.activation],
        layer_norm_epsilon=LAYER_NORM_EPS,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        tie_word_embeddings=True,
        **special,
    )


def gpt_config(hf: dict[str, Any], bias: bool) -> GPTConfig:
    """Our GPTConfig from a `config.json` this module's `config_json` wrote; ValueError naming
    the key if it describes a model gpt/models/model.py does not build."""
    kind = hf.get("model_type")
    activation = {v: k for k, v in ACTIVATIONS.items()}
    if kind == "gpt_neox":
        rope = hf.get("rope_parameters") or {}
        _expect(hf, "use_parallel_residual", False)
        _expect(rope, "partial_rotary_factor", 1.0)
        _expect(rope, "rope_theta", ROPE_THETA)
        _expect(hf, "intermediate_size", 4 * hf.get("hidden_size", 0))
        act, shape = hf.get("hidden_act"), ("num_hidden_layers", "num_attention_heads",
                                            "hidden_size", "max_position_embeddings")  # fmt: skip
        dropout, position = hf.get("hidden_dropout", 0.0), "rope"
    elif kind == "gpt2":
        _expect(hf, "n_inner", None)
        _expect(hf, "scale_attn_weights", True)
        _expect(hf, "scale_attn_by_inverse_layer_idx", False)
        _expect(hf, "reorder_and_upcast_attn", False)
        _expect(hf, "add_cross_attention", False)
        act, shape = hf.get("activation_function"), ("n_layer", "n_head", "n_embd", "n_positions")
        dropout, position = hf.get("resid_pdrop", 0.0), "learned"
    else:
        raise ValueError(f"model_type {kind!r}: expected gpt_neox or gpt2")
    act = SAME_ACTIVATION.get(act, act)
    if act not in activation:
        raise ValueError(f"activation {act!r}: expected one of {sorted(activation)}")
    _expect(hf, "tie_word_embeddings", True)
    _expect(hf, "layer_norm_epsilon" if kind == "gpt2" else "layer_norm_eps", LAYER_NORM_EPS)
    n_layer, n_head, n_embd, block_size = (hf.get(k) for k in shape)
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                     dropout=dropout, bias=bias, position=position,
                     activation=activation[act], spelling=0,  # an export's table is plain
                     vocab_size=hf.get("vocab_size"))  # fmt: skip


def _expect(obj: dict[str, Any], key: str, want: Any) -> None:
    if obj.get(key, want) != want:
        raise ValueError(f"{key} {obj[key]!r}: gpt/models/model.py builds only {want!r}")


def _layer_names(config: GPTConfig) -> dict[str, str]:
    """Ours -> theirs for one block's modules, `{i}` standing for the block's index."""
    ours = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    if config.position == "learned":
        return {name: "transformer.h.{i}." + name for name in ours}
    theirs = ("input_layernorm", "attention.query_key_value", "attention.dense",
              "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")  # fmt: skip
    return {a: "gpt_neox.layers.{i}." + b for a, b in zip(ours, theirs, strict=True)}


def _module_names(config: GPTConfig) -> list[tuple[str, str]]:
    """(ours, theirs) for every module with parameters."""
    if config.position == "learned":
        top = [(name, name) for name in ("transformer.wte", "transformer.wpe", "transformer.ln_f")]
    else:
        top = [("transformer.wte", "gpt_neox.embed_in"),
               ("transformer.ln_f", "gpt_neox.final_layer_norm")]  # fmt: skip
    layer = _layer_names(config).items()
    return top + [(f"transformer.h.{i}.{a}", b.format(i=i))
                  for i in range(config.n_layer) for a, b in layer]  # fmt: skip


def _tensors(module: str) -> tuple[str, ...]:
    """The tensors of a module in the export: embeddings have no bias; every other module has
    one in both architectures, which is zeros for a model without."""
    return ("weight",) if module in EMBEDDINGS else ("weight", "bias")


def _per_head(w: torch.Tensor, n_head: int, inverse: bool = False) -> torch.Tensor:
    """[q | k | v] rows (ours) <-> [q_h, k_h, v_h] rows per head (GPT-NeoX's)."""
    rest = w.shape[1:]
    hs = w.size(0) // (3 * n_head)
    if inverse:
        return w.reshape(n_head, 3, hs, *rest).transpose(0, 1).reshape(w.shape)
    return w.reshape(3, n_head, hs, *rest).transpose(0, 1).reshape(w.shape)


def _convert(config: GPTConfig, module: str, kind: str, t: torch.Tensor,
             to_theirs: bool) -> torch.Tensor:  # fmt: skip
    if config.position == "rope" and module.endswith("attn.c_attn"):
        t = _per_head(t, config.n_head, inverse=not to_theirs)
    elif config.position == "learned" and kind == "weight" and module.endswith(LINEARS):
        t = t.t()  # GPT-2's Conv1D stores (in, out)
    return t.contiguous()


def to_hf(config: GPTConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' tensors from ours (`GPT.state_dict()` with the head left out and the
    embedding unpadded); absent biases become zeros."""
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _module_names(config):
        for kind in _tensors(ours):
            weight = weights[f"{ours}.weight"]
            t = weights.get(f"{ours}.{kind}", torch.zeros(weight.size(0), dtype=weight.dtype))
            out[f"{theirs}.{kind}"] = _convert(config, ours, kind, t, to_theirs=True)
    return out


def from_hf(config: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Ours from transformers' (the inverse of `to_hf`): KeyError naming a missing tensor;
    biases left out when the config has none (they are the zeros `to_hf` wrote)."""
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _module_names(config):
        for kind in _tensors(ours):
            if kind == "bias" and not config.bias:
                continue
            t = tensors[f"{theirs}.{kind}"]
            out[f"{ours}.{kind}"] = _convert(config, ours, kind, t, to_theirs=False)
    return out


def lora_targets(config: GPTConfig, targets: list[str]) -> list[str]:
    """The architecture's names of the projections our `targets` (LORA_TARGETS' names) are, as
    PEFT's `target_modules` takes them (a module's name or its last parts)."""
    layer = _layer_names(config)
    return [layer[target].split("{i}.")[1] for target in targets]


def lora_to_hf(config: GPTConfig, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LoRA adapters' tensors (`<our module>.lora_A.weight`, `.lora_B.weight`) under the
    architecture's module names. A is (rank, in) and B (out, rank) in both: GPT-2's Conv1D
    takes them as they are (PEFT's fan_in_fan_out transposes their product); for GPT-NeoX the
    B of c_attn is regrouped per head, as `to_hf` regroups the rows of the weight it adds to."""
    theirs = dict(_module_names(config))
    out = {}
    for name, t in adapters.items():
        module, kind, _ = name.rsplit(".", 2)
        if kind == "lora_B" and config.position == "rope" and module.endswith("attn.c_attn"):
            t = _per_head(t, config.n_head)
        out[f"{theirs[module]}.{kind}.weight"] = t.contiguous()
    return out


def normalised(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' tensors as `from_hf` reads them, however they were saved: a GPT-2 base
    model's names (no `transformer.` prefix) prefixed, and the attention-mask buffers some
    GPT-2 checkpoints hold dropped (they are no weights: our attention is causal anyway)."""
    gpt2_base = "wte.weight" in tensors and f"{GPT2_PREFIX}wte.weight" not in tensors
    out = {}
    for name, t in tensors.items():
        if name.endswith(GPT2_BUFFERS):
            continue
        out[GPT2_PREFIX + name if gpt2_base and not name.startswith("lm_head") else name] = t
    return out


def has_bias(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether an export's bias tensors carry anything (a model trained without bias exports
    zeros, which both architectures require)."""
    return any(name.endswith(".bias") and bool(t.any()) for name, t in tensors.items())
