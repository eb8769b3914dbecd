"""The exported model: a Hugging Face model directory, what train-gpt hands to generative-prompt
and to every tool that reads that format.

`model/` holds what transformers writes for the architecture gpt/models/hf.py maps our model to
(GPT-NeoX with rotary positions, GPT-2 with learned ones): `config.json`,
`generation_config.json` (end-of-text ends a reply, as it ends ours) and `model.safetensors`;
and what `PreTrainedTokenizerFast.save_pretrained` writes for the tokenizer's `tokenizers` twin
(`tokenizer.json`, `tokenizer_config.json`). `AutoModelForCausalLM.from_pretrained(model_dir)`
and `AutoTokenizer.from_pretrained(model_dir)` load it offline with no custom code; our own CLI
reads the same files with safetensors, json and tokenizers (to check `tokenizer.json` is the twin
of a tokenizer it has), and never imports transformers (a second of start-up) to do so. One
directory, written atomically.

The weights are those of the tokenizer's vocabulary: the token embedding, which is also the
output head, has exactly `vocab_size` rows and is stored once. The padding rows the model trains
with (gpt/models/model.py) stay out of the export, and loading puts zeros in their place, which
nothing reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F

from gpt.data.tokenizer import ENDOFTEXT, Tokenizer, tokenizer_from_hf
from gpt.errors import InputError, first_line
from gpt.models import hf
from gpt.models.model import GPT
from gpt.rundir import atomic

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
EMBEDDING, HEAD = "transformer.wte.weight", "lm_head.weight"  # one tensor (weight tying)
SPELLING = "transformer.wse.weight"  # a spelled embedding's n-gram vectors (training only)


def export_weights(model: GPT) -> dict[str, torch.Tensor]:
    """Our tensors of the export: the tied embedding once, without padding rows, and a spelled
    one written out as the plain table it is."""
    weights = model.state_dict()
    del weights[HEAD]
    weights.pop(SPELLING, None)
    weights[EMBEDDING] = model.embedding()[: model.config.vocab_size]
    return {name: t.detach().cpu().contiguous() for name, t in weights.items()}


def save_export(model: GPT, tokenizer: Tokenizer, dest: Path, finetuned_from: str = "") -> None:
    """Write `dest/` as a Hugging Face model directory, atomically; `finetuned_from` (what
    --init_from started from) goes into its config.json as `finetuned_from`."""
    import transformers  # here, not at the top: its import costs a second that only this needs

    config = model.config
    arch = hf.architecture(config)
    config_class = getattr(transformers, hf.CONFIG_CLASSES[arch])
    hf_config = config_class(**hf.hf_config(config, tokenizer.eot_id))
    hf_config.architectures = [arch]
    hf_config.dtype = "float32"
    if finetuned_from:
        hf_config.finetuned_from = finetuned_from  # config.json keeps unknown keys
    generation = transformers.GenerationConfig(
        bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id,
        pad_token_id=tokenizer.eot_id,  # a batch pads with end-of-text, which ends a reply anyway
    )
    special = {} if tokenizer.eot_id is None else {"eos_token": ENDOFTEXT, "bos_token": ENDOFTEXT}
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.to_hf(), model_max_length=config.block_size, **special
    )
    what = "the exported model"
    with atomic.staged_dir(dest, what=what) as stage:
        tensors = hf.to_hf(config, export_weights(model))
        safetensors.torch.save_file(tensors, str(stage / WEIGHTS), metadata={"format": "pt"})
        hf_config.save_pretrained(stage)
        generation.save_pretrained(stage)
        hf_tokenizer.save_pretrained(stage)


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

