"""The exported model: a Hugging Face model directory, what train-gpt hands to generative-prompt
and to every tool that reads that format.

`model/` holds the files transformers reads for the architecture gpt/models/hf.py maps our model
to (GPT-NeoX with rotary positions, GPT-2 with learned ones): `config.json`,
`generation_config.json` (end-of-text ends a reply, as it ends ours; a chat model's reply ends at
`<|im_end|>` too), `model.safetensors`, the tokenizer's `tokenizers` twin (`tokenizer.json`) and
the `tokenizer_config.json` that makes it a fast tokenizer (a chat model's also holds the chat
template, gpt/tokenizer/chat.py, which every chat server renders).
`AutoModelForCausalLM.from_pretrained(model_dir)` and `AutoTokenizer.from_pretrained(model_dir)`
load it offline with no custom code (tests/workload/models/test_hf.py holds them to what
transformers' own `save_pretrained` writes).
Neither writing nor reading imports transformers: that import costs every train-gpt process
1.5 s of start-up, and the files are JSON. Our CLI reads them with safetensors, json and
tokenizers (to check `tokenizer.json` is the twin of a tokenizer it has). One directory, written
atomically.

The weights are those of the tokenizer's vocabulary: the token embedding, which is also the
output head, has exactly `vocab_size` rows and is stored once. The padding rows the model trains
with (gpt/models/model.py) stay out of the export, and loading puts zeros in their place, which
nothing reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F

from gpt.errors import InputError, first_line
from gpt.models import hf, lora
from gpt.models.model import GPT
from gpt.rundir import atomic
from gpt.tokenizer import chat
from gpt.tokenizer.huggingface import hf_tokenizer, tokenizer_from_hf
from gpt.tokenizer.kinds import Tokenizer
from gpt.tokenizer.ranks import ENDOFTEXT

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
GENERATION, TOKENIZER_CONFIG = "generation_config.json", "tokenizer_config.json"
EMBEDDING, HEAD = "transformer.wte.weight", "lm_head.weight"  # one tensor (weight tying)
SPELLING = "transformer.wse.weight"  # a spelled embedding's n-gram vectors (training only)


def export_weights(model: GPT) -> dict[str, torch.Tensor]:
    """Our tensors of the export: the tied embedding once, without padding rows, a spelled
    one written out as the plain table it is, and LoRA's adapters merged into their weights."""
    weights = lora.merged_weights(model) if lora.has_adapters(model) else model.state_dict()
    del weights[HEAD]
    weights.pop(SPELLING, None)
    weights[EMBEDDING] = model.embedding()[: model.config.vocab_size]
    return {name: t.detach().cpu().contiguous() for name, t in weights.items()}


def save_export(model: GPT, tokenizer: Tokenizer, dest: Path, finetuned_from: str = "") -> None:
    """Write `dest/` as a Hugging Face model directory, atomically; `finetuned_from` (what
    --init_from started from) goes into its config.json as `finetuned_from` (transformers keeps
    keys it does not know)."""
    config, eot = model.config, tokenizer.eot_id
    files = {
        CONFIG: {**hf.config_json(config, eot),
                 **({"finetuned_from": finetuned_from} if finetuned_from else {})},  # fmt: skip
        # A batch pads with end-of-text, which ends a reply anyway.
        GENERATION: {"bos_token_id": eot, "eos_token_id": eos_ids(tokenizer),
                     "pad_token_id": eot},
        TOKENIZER_CONFIG: tokenizer_config(tokenizer, config.block_size),
    }
    with atomic.staged_dir(dest, what="the exported model") as stage:
        tensors = hf.to_hf(config, export_weights(model))
        safetensors.torch.save_file(tensors, str(stage / WEIGHTS), metadata={"format": "pt"})
        for name, content in files.items():
            (stage / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        hf_tokenizer(tokenizer).save(str(stage / TOKENIZER))


def eos_ids(tokenizer: Tokenizer) -> int | list[int] | None:
    """The ids that end a reply: end-of-text, and a chat model's end of turn (first: what
    servers that take one stop at)."""
    if not tokenizer.chat:
        return tokenizer.eot_id
    return [tokenizer.vocab_size - len(chat.MARKERS) + chat.MARKERS.index(chat.IM_END),
            tokenizer.eot_id]


def tokenizer_config(tokenizer: Tokenizer, block_size: int) -> dict[str, Any]:
    """`tokenizer_config.json`: AutoTokenizer's class for a bare `tokenizer.json` (transformers
    4 and 5 both know PreTrainedTokenizerFast; 5 names it TokenizersBackend too), the context
    window as its `model_max_length`, and end-of-text as its BOS and EOS where there is one. A
    chat model's EOS is the end of a turn, `<|im_end|>`, as ChatML's models (Qwen's) have it,
    and its `chat_template` renders the format it was trained on."""
    special = {} if tokenizer.eot_id is None else {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT}
    if tokenizer.chat:
        special |= {"eos_token": chat.IM_END, "chat_template": chat.TEMPLATE}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
            **special}  # fmt: skip


def load_export(src: Path, device: str = "cpu") -> tuple[GPT, Tokenizer]:
    """Load `src/` into an eval-mode GPT and its tokenizer; bad files raise InputError."""
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (src / name).is_file():
            raise InputError(
                f"{src}: no exported model ({name} missing); run `python -m gpt train-gpt` first"
            )
    try:
        hf_config = json.loads((src / CONFIG).read_text())
        tokenizer_json = json.loads((src / TOKENIZER).read_text())
    except (ValueError, OSError) as e:
        raise InputError(f"{src}: unreadable model config or tokenizer: {e}") from None
    if isinstance(hf_config, dict) and "model_type" not in hf_config and "n_layer" in hf_config:
        raise InputError(
            f"{src}: exported in this project's earlier format, not a Hugging Face directory; "
            "run the same `python -m gpt train-gpt` again to re-export it (a finished run trains "
            "nothing; data/ of a compacted GPT-2 vocabulary from then needs load-corpus again)"
        )
    try:
        weights = hf.normalised(safetensors.torch.load_file(str(src / WEIGHTS), device="cpu"))
    except (safetensors.SafetensorError, RuntimeError, OSError) as e:
        raise InputError(
            f"{src / WEIGHTS}: not a valid safetensors model ({first_line(e)})"
        ) from None
    try:
        config = hf.gpt_config(hf_config, bias=hf.has_bias(weights))
        tokenizer = tokenizer_from_hf(tokenizer_json)
    except (ValueError, TypeError, AttributeError) as e:
        raise InputError(f"{src}: not a model this project wrote: {e}") from None
    model = GPT(config)
    try:
        ours = hf.from_hf(config, weights)
    except KeyError as e:
        raise InputError(f"{src / WEIGHTS}: does not fit {src / CONFIG}: {e} missing") from None
    want = {name: tuple(t.shape) for name, t in export_weights(model).items()}
    got = {name: tuple(t.shape) for name, t in ours.items()}
    if got != want:
        wrong = sorted(name for name in want if want[name] != got[name])
        raise InputError(
            f"{src / WEIGHTS}: does not fit {src / CONFIG}: {wrong[0]} is {got[wrong[0]]}, "
            f"expected {want[wrong[0]]} ({len(wrong)} tensor(s) differ)"
        )
    load_unpadded(model, ours)
    return model.to(device).eval(), tokenizer


def finetuned_from(src: Path) -> str:
    """What the export's model was fine-tuned from (config.json's `finetuned_from`, which
    `save_export` writes for a run with --init_from); "" for one trained from scratch."""
    try:
        value = json.loads((src / CONFIG).read_text()).get("finetuned_from", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def load_unpadded(model: GPT, weights: dict[str, torch.Tensor]) -> None:
    """Load `weights` whose embedding (the output head too) has exactly vocab_size rows, as an
    export's or nanoGPT's has, into `model`, which has every other tensor by the same name; the
    padding rows are zeros, which nothing reads."""
    rows = model.lm_head.weight.size(0)
    padded = F.pad(weights[EMBEDDING], (0, 0, 0, rows - model.config.vocab_size))
    model.load_state_dict({**weights, EMBEDDING: padded, HEAD: padded}, strict=True)

