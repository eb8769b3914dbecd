"""load-corpus: turn a text into training data in the run directory.

    source -> bytes -> cleaned text -> split (last val_fraction is validation) -> tokenize each
    part -> corpus/{text.txt,source.json} + data/{train.bin,val.bin,tokenizer.json,meta.json}

Everything that can be refused is refused before the first write; both directories are then
written in staging directories and renamed into place, so a failure leaves nothing half-written.
Re-running with the same inputs is a no-op; different inputs need --overwrite.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from gpt.atomic import staged_dir, write_bytes, write_json
from gpt.config import CorpusConfig
from gpt.errors import InputError
from gpt.rundir import CorpusInputs, DataMeta, RunDir, dtype_for
from gpt.sources import Document, Download, canonical, kind_of, read_source
from gpt.tokenizer import GPT2Tokenizer, Tokenizer, tokenize_corpus


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
    inputs = CorpusInputs(
        source=canonical(cfg.source),
        tokenizer=cfg.tokenizer,
        compact=compacted,
        max_vocab=cfg.max_vocab if compacted else 0,
        val_fraction=cfg.val_fraction,
        block_size=cfg.block_size,
        corpus_sha256=hashlib.sha256(text_bytes).hexdigest(),
    )
    if up_to_date(rd, inputs, cfg.overwrite):
        print(f"corpus: {rd.path} already up to date (same inputs and text); nothing written")
        return

    train_text, val_text = split(text, cfg.val_fraction)
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

    meta = DataMeta(
        **dataclasses.asdict(inputs),
        vocab_size=tok.vocab_size,
        eot_id=tok.eot_id,
        dtype=dtype_for(tok.vocab_size),
        train_tokens=len(train_ids),
        val_tokens=len(val_ids),
        train_bytes=len(train_text.encode("utf-8")),
        val_bytes=len(val_text.encode("utf-8")),
    )
    source = {
        "source": inputs.source,
        "kind": kind,
        "documents": [doc.record() for doc in docs],
        "kept_bytes": len(text_bytes),
        "sha256": inputs.corpus_sha256,
    }
    write(rd, text_bytes, source, tok, train_ids, val_ids, meta)
    print(
        f"corpus: train {meta.train_tokens:,} tokens ({meta.train_bytes:,} bytes), "
        f"val {meta.val_tokens:,} tokens ({meta.val_bytes:,} bytes), {meta.dtype}"
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


def up_to_date(rd: RunDir, inputs: CorpusInputs, overwrite: bool) -> bool:
    """True if the run already holds data from exactly these inputs; refuse other inputs."""
    if not rd.meta_json.exists():
        return False
    old = DataMeta.read_raw(rd.meta_json)
    complete = all(p.exists() for p in outputs(rd))
    diff = inputs.changed(old)
    if complete and not diff:
        return not overwrite
    if overwrite:
        print(f"corpus: --overwrite: replacing the corpus and data of {rd.path}")
        return False
    now = dataclasses.asdict(inputs)
    what = ", ".join(f"{k} {old.get(k)!r} there, {now[k]!r} now" for k in diff) or "incomplete"
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
    meta: DataMeta,
) -> None:
    import numpy as np

    # Both directories are complete before either is renamed into place (data/ first, then
    # corpus/); an error anywhere removes both staging directories.
    with staged_dir(rd.corpus_dir) as corpus, staged_dir(rd.data_dir) as data:
        write_bytes(corpus / rd.text_txt.name, text)
        write_json(corpus / rd.source_json.name, source)
        np.asarray(train_ids, dtype=meta.dtype).tofile(data / rd.train_bin.name)
        np.asarray(val_ids, dtype=meta.dtype).tofile(data / rd.val_bin.name)
        write_json(data / rd.tokenizer_json.name, tok.to_json())
        meta.write(data / rd.meta_json.name)


def removal(doc: Document) -> str:
    if not doc.removed:
        return "cleaning removed nothing"
    parts = ", ".join(f"{k} {v:,}" for k, v in doc.removed.items())
    return f"cleaned ({parts}); kept {doc.record()['kept_bytes']:,} bytes"


def describe(tok: Tokenizer) -> str:
    if isinstance(tok, GPT2Tokenizer) and tok.kept is not None:
        return f"gpt2 compacted to {tok.vocab_size:,} of {tok.enc.n_vocab:,} tokens"
    return f"{tok.name}, vocabulary {tok.vocab_size:,}"
