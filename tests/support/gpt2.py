"""GPT-2 as the Hub holds it, made here: a `GPT2LMHeadModel` with random weights that
transformers writes (nothing downloads), with GPT-2's own tokenizer files, and a Hub cache
holding such a folder as huggingface_hub lays one out (for HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

from gpt.tokenizer.huggingface import hf_tokenizer
from gpt.tokenizer.kinds import GPT2Tokenizer

# Two small GPT-2 shapes: GPT-2's own choices (gelu_new, biases, learned positions, tied head,
# its 50,257 tokens), and one with the exact GELU and another context and width.
SMALL_GPT2 = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, activation_function="gelu_new")
OTHER_GPT2 = dict(n_layer=3, n_head=4, n_embd=48, n_positions=40, activation_function="gelu")


def random_gpt2(shape: dict, seed: int = 0):
    """A GPT2LMHeadModel of `shape` whose every tensor is random, biases and LayerNorms too
    (transformers initialises those to 0 and 1, which would hide a bias left out), its linear
    weights ten times GPT-2's initial scale: activations of order 1, where the tanh GELU and the
    exact one differ by more than the tests' tolerance (at 0.02 they agree to 1e-6)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(**shape, vocab_size=50257, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
            elif name.endswith(("c_attn.weight", "c_fc.weight", "c_proj.weight")):
                p.normal_(std=0.2)
    return model.eval()


def gpt2_tokenizer_files(dest: Path) -> None:
    """GPT-2's own tokenizer as the Hub's openai-community/gpt2 holds it: vocab.json,
    merges.txt and the tokenizer.json transformers' GPT2TokenizerFast writes from them (a
    byte-level pre-tokenizer with GPT-2's regex: not the one this project's export writes)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in _tokenizer_files().items():
        (dest / name).write_bytes(data)


@functools.cache
def _tokenizer_files() -> dict[str, bytes]:
    """The files, made once a session (a few seconds)."""
    import transformers

    ours = json.loads(hf_tokenizer(GPT2Tokenizer()).to_str())["model"]
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        (dest / "vocab.json").write_text(json.dumps(ours["vocab"]))
        merges = [m if isinstance(m, str) else " ".join(m) for m in ours["merges"]]
        (dest / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        tok = transformers.GPT2TokenizerFast(vocab=ours["vocab"],
                                             merges=[tuple(m) for m in ours["merges"]])
        tok.save_pretrained(dest)
        return {f.name: f.read_bytes() for f in dest.iterdir()}


def gpt2_folder(dest: Path, shape: dict = SMALL_GPT2, seed: int = 0):
    """A GPT-2 folder as the Hub's: the model (safetensors), config and GPT-2's tokenizer;
    returns the model."""
    model = random_gpt2(shape, seed)
    model.save_pretrained(dest)
    gpt2_tokenizer_files(dest)
    return model


def hub_cache(cache: Path, repo: str, folder: Path, commit: str = "a" * 40) -> Path:
    """`cache` (huggingface_hub's `HF_HOME/hub`) holding `folder` as repository `repo` at
    `commit`, its `main`: blobs by content, the snapshot's files linking to them."""
    base = cache / f"models--{repo.replace('/', '--')}"
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (base / "blobs").mkdir(exist_ok=True)
    for f in folder.iterdir():
        blob = base / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob.name)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    return snapshot
