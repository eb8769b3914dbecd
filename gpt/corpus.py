"""load-corpus: turn a text into training data in the run directory.

    source -> bytes -> cleaned text -> split (last val_fraction is validation) -> tokenize each
    part -> corpus/{text.txt,source.json} + data/{train.bin,val.bin,tokenizer.json,meta.json}

Everything that can be refused is refused before the first write; both directories are then
written in staging directories and renamed into place, so a failure leaves nothing half-written.
Re-running with the same inputs is a no-op; different inputs need --overwrite.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpt.atomic import staged_dir, write_bytes, write_json
from gpt.config import RunConfig
from gpt.errors import InputError
from gpt.rundir import RunDir
from gpt.sources import DEFAULT_SOURCE, Document, Download, canonical, kind_of, read_source

# numpy and tiktoken (the tokenizers) are imported where they are used: the pipeline's component
# image, which has neither, imports CorpusConfig to check a step's flags before it creates a
# TrainJob.
if TYPE_CHECKING:
    from gpt.tokenizer import Tokenizer

# The meta.json keys that identify the inputs: equal keys mean a rerun has nothing to do.
INPUT_KEYS = (
    "source", "tokenizer", "compact", "max_vocab", "val_fraction", "block_size", "corpus_sha256"
)


@dataclass
class CorpusConfig(RunConfig):
    source: str = DEFAULT_SOURCE
    """What to train on: an http(s) URL, a local .txt file, a local directory (its *.txt files in
    name order), or 'default' (or empty) for the embedded Comedy of Errors, which needs no
    network."""
    tokenizer: Literal["gpt2", "char"] = "gpt2"
    """gpt2: GPT-2 BPE (tiktoken, offline); char: one token per character of the corpus."""
    compact: bool = True
    """gpt2 only: keep just the BPE tokens the corpus uses plus the 256 single bytes, so a small
    corpus gets a small embedding table (a prompt's unseen tokens are spelt with the kept ones)."""
    max_vocab: int = 8192
    """gpt2 with --compact: keep at most this many ids (the 256 bytes, end-of-text and the most
    frequent BPE tokens); rarer tokens are spelt with the kept ones. 0: no limit."""
    val_fraction: float = 0.1
    """Fraction of the cleaned text, taken from its end, held out for validation."""
    block_size: int = 256
    """Context length training will use: the corpus must give one block to each split."""
    overwrite: bool = False
    """Replace this run's corpus and data even if they came from different inputs."""
    download_timeout: float = 30.0
    """Seconds to wait on a URL (connect and each read) before an attempt fails."""
    download_retries: int = 3
    """Extra attempts after a failed download (connection errors, timeouts, HTTP 5xx/429)."""
    download_backoff: float = 1.0
    """Seconds before the first retry; doubled before each further one."""
    max_bytes: int = 100_000_000
    """Refuse a source larger than this many bytes (downloads stop reading past it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"--val_fraction {self.val_fraction}: must be in (0, 1)")
        if self.max_vocab and self.max_vocab < 257:  # the 256 bytes and end-of-text
            raise ValueError(f"--max_vocab {self.max_vocab}: must be 0 (no limit) or >= 257")
        if self.block_size < 1:
            raise ValueError(f"--block_size {self.block_size}: must be at least 1")
        if not self.download_timeout > 0:
            raise ValueError(f"--download_timeout {self.download_timeout}: must be positive")
        if self.download_retries < 0:
            raise ValueError(f"--download_retries {self.download_retries}: must be >= 0")
        if self.download_backoff < 0:
            raise ValueError(f"--download_backoff {self.download_backoff}: must be >= 0")
        if self.max_bytes < 1:
            raise ValueError(f"--max_bytes {self.max_bytes}: must be at least 1")


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size < 2**16 else "uint32"


def split(text: str, val_fraction: float) -> tuple[str, str]:
    """Train is the head, validation the last `val_fraction` of the text (as nanoGPT splits)."""
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def main(cfg: CorpusConfig) -> None:
    rd = cfg.rundir
    kind = kind_of(cfg.source)
    docs = read_source(cfg.source, download_of(cfg))
    for doc in docs:
        print(f"corpus: read {doc.origin} ({kind}): {doc.raw_bytes:,} bytes; {removal(doc)}")
    text = "\n\n".join(doc.text for doc in docs)
    text_bytes = text.encode("utf-8")
    compacted = cfg.compact and cfg.tokenizer == "gpt2"
    inputs = {
        "source": canonical(cfg.source),
        "tokenizer": cfg.tokenizer,
        "compact": compacted,
        "max_vocab": cfg.max_vocab if compacted else 0,
        "val_fraction": cfg.val_fraction,
        "block_size": cfg.block_size,
        "corpus_sha256": hashlib.sha256(text_bytes).hexdigest(),
    }
    if up_to_date(rd, inputs, cfg.overwrite):
        print(f"corpus: {rd.path} already up to date (same inputs and text); nothing written")
        return

    train_text, val_text = split(text, cfg.val_fraction)
    from gpt.tokenizer import tokenize_corpus

    tok, (train_ids, val_ids) = tokenize_corpus(
        cfg.tokenizer, [train_text, val_text], cfg.compact, cfg.max_vocab
    )
    need = cfg.block_size + 1  # a block of inputs plus the next token as its last target
    if len(train_ids) < need or len(val_ids) < need:
        raise InputError(
            f"--source {cfg.source!r}: corpus too short for --block_size {cfg.block_size}: "
            f"{len(train_ids)} training and {len(val_ids)} validation tokens, "
            f"each split needs {need}"
        )
    print(f"corpus: tokenizer {describe(tok)}")

    meta = {
        **inputs,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "dtype": dtype_for(tok.vocab_size),
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "train_bytes": len(train_text.encode("utf-8")),
        "val_bytes": len(val_text.encode("utf-8")),
    }
    source = {
        "source": inputs["source"],
        "kind": kind,
        "documents": [doc.record() for doc in docs],
        "kept_bytes": len(text_bytes),
        "sha256": inputs["corpus_sha256"],
    }
    write(rd, text_bytes, source, tok, train_ids, val_ids, meta)
    print(
        f"corpus: train {meta['train_tokens']:,} tokens ({meta['train_bytes']:,} bytes), "
        f"val {meta['val_tokens']:,} tokens ({meta['val_bytes']:,} bytes), {meta['dtype']}"
    )
    print(f"corpus: wrote {rd.corpus_dir}/{{text.txt,source.json}}")
    print(f"corpus: wrote {rd.data_dir}/{{train.bin,val.bin,tokenizer.json,meta.json}}")


def download_of(cfg: CorpusConfig) -> Download:
    return Download(
        timeout=cfg.download_timeout,
        retries=cfg.download_retries,
        backoff=cfg.download_backoff,
        max_bytes=cfg.max_bytes,
    )


def up_to_date(rd: RunDir, inputs: dict[str, Any], overwrite: bool) -> bool:
    """True if the run already holds data from exactly these inputs; refuse other inputs."""
    if not rd.meta_json.exists():
        return False
    try:
        old = json.loads(rd.meta_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    complete = all(p.exists() for p in outputs(rd))
    diff = [k for k in INPUT_KEYS if old.get(k) != inputs[k]]
    if complete and not diff:
        return not overwrite
    if overwrite:
        print(f"corpus: --overwrite: replacing the corpus and data of {rd.path}")
        return False
    what = ", ".join(f"{k} {old.get(k)!r} there, {inputs[k]!r} now" for k in diff) or "incomplete"
    raise InputError(
        f"--run {rd.run!r}: {rd.path} already holds data from other inputs ({what}); "
        "use a new --run or pass --overwrite true"
    )


def outputs(rd: RunDir) -> list[Path]:
    return [rd.text_txt, rd.source_json, rd.train_bin, rd.val_bin, rd.tokenizer_json, rd.meta_json]


def write(
    rd: RunDir,
    text: bytes,
    source: dict[str, Any],
    tok: Tokenizer,
    train_ids: list[int],
    val_ids: list[int],
    meta: dict[str, Any],
) -> None:
    import numpy as np

    # Both directories are complete before either is renamed into place (data/ first, then
    # corpus/); an error anywhere removes both staging directories.
    with staged_dir(rd.corpus_dir) as corpus, staged_dir(rd.data_dir) as data:
        write_bytes(corpus / rd.text_txt.name, text)
        write_json(corpus / rd.source_json.name, source)
        np.asarray(train_ids, dtype=meta["dtype"]).tofile(data / rd.train_bin.name)
        np.asarray(val_ids, dtype=meta["dtype"]).tofile(data / rd.val_bin.name)
        write_json(data / rd.tokenizer_json.name, tok.to_json())
        write_json(data / rd.meta_json.name, meta)


def removal(doc: Document) -> str:
    if not doc.removed:
        return "cleaning removed nothing"
    parts = ", ".join(f"{k} {v:,}" for k, v in doc.removed.items())
    return f"cleaned ({parts}); kept {doc.record()['kept_bytes']:,} bytes"


def describe(tok: Tokenizer) -> str:
    from gpt.tokenizer import GPT2Tokenizer

    if isinstance(tok, GPT2Tokenizer) and tok.kept is not None:
        return f"gpt2 compacted to {tok.vocab_size:,} of {tok.enc.n_vocab:,} tokens"
    return f"{tok.name}, vocabulary {tok.vocab_size:,}"
