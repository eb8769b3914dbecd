"""The corpus stage's work: a text turned into training data in the run directory, in bounded
memory (the stage's entry point, gpt/load_corpus.py, calls `build`).

    source -> cleaned text (streamed to a file, a blank line between documents) -> split (last
    val_fraction of its characters is validation) -> tokenize each part (streamed, every core;
    end-of-text between documents where the tokenizer has one) ->
    corpus/{text.txt,source.json} + data/{train.bin,val.bin,tokenizer.json,meta.json}

No pass holds the corpus: documents are cleaned chunk by chunk into a scratch directory beside
the run (gpt/data/sources.py, gpt/data/cleaning.py), tokenized from there into token files
(gpt/data/tokenfiles.py), and only then moved into staging directories that are renamed into place,
so a refusal or a kill leaves nothing half-written (a killed run's scratch is swept by the next).
Re-running with the same inputs is a no-op; different inputs need --overwrite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from array import array
from pathlib import Path
from typing import Any, BinaryIO

from gpt.config.configs import CorpusConfig
from gpt.data.conversations import Conversations, chat_tokenizer
from gpt.data.formats import Format, format_or_text
from gpt.data.sources import Document, Download, canonical, corpus_files, kind_of, read_source
from gpt.data.tokenfiles import TokenFiles, tokenize_file, tokenize_with
from gpt.errors import InputError
from gpt.fetch import model_source
from gpt.progress import Progress
from gpt.rundir.atomic import scratch_dir, staged_dir, write_json
from gpt.rundir.layout import (
    ADDED_INPUTS,
    CorpusInputs,
    DataMeta,
    RunDir,
    dtype_for,
    read_json_object,
)
from gpt.tokenizer.kinds import GPT2Tokenizer, Tokenizer
from gpt.tokenizer.recognition import pretrained_tokenizer


def cut_at(chars: int, val_fraction: float) -> int:
    """Where validation starts in a text of `chars` characters: train is the head, validation
    the last `val_fraction` (as nanoGPT splits)."""
    return int(chars * (1 - val_fraction))


# UTF-8's continuation bytes: a character is one byte that is not one of these.
_CONTINUATION = bytes(range(0x80, 0xC0))


class TextFile:
    """The cleaned text as it is written: its sha256, characters and bytes, counted on the way."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha256, self.chars, self.nbytes = f, hashlib.sha256(), 0, 0

    def write(self, data: bytes) -> None:
        """Append `data`, UTF-8 text (a piece may end inside a character the next one ends)."""
        self.f.write(data)
        self.sha256.update(data)
        self.chars += len(data) if data.isascii() else len(data.translate(None, _CONTINUATION))
        self.nbytes += len(data)


class Breaks:
    """Where the cleaned text's documents meet: the byte offset of each separator between two,
    kept in a file (8 bytes a document: a corpus of millions of records is not held)."""

    HELD = 1 << 16  # offsets held before they are appended to the file

    def __init__(self, path: Path) -> None:
        self.path, self.count, self._held = path, 0, array("q")

    def add(self, at: int) -> None:
        self._held.append(at)
        self.count += 1
        if len(self._held) >= self.HELD:
            self.flush()

    def flush(self) -> None:
        with open(self.path, "ab") as f:
            self._held.tofile(f)
        del self._held[:]

    def finish(self) -> Path | None:
        """The file of offsets, every one written (None for a text of one document)."""
        self.flush()
        return self.path if self.count else None


def build(cfg: CorpusConfig) -> DataMeta | None:
    """Clean --source into a scratch file; unless the run holds data of these inputs already
    (then None), tokenize it and move the text and token files into place: their `DataMeta`."""
    rundir = cfg.rundir
    kind = kind_of(cfg.source)
    with scratch_dir(rundir.path, what="the corpus (download, cleaned text, token ids)") as scratch:
        text_path = scratch / rundir.text_txt.name
        breaks = Breaks(scratch / "breaks")
        chats = None
        if cfg.chat:  # conversations: rendered as they are read (gpt/data/conversations.py)
            tok = init_from_tokenizer(cfg) or GPT2Tokenizer()
            chats = Conversations(chat_tokenizer(tok, "--chat true"), scratch, cfg.block_size + 1)
        text, docs = clean(cfg, kind, text_path, scratch, breaks, chats)
        inputs = inputs_of(cfg, text, chats.count if chats else breaks.count + 1)
        if up_to_date(rundir, inputs, cfg.overwrite):
            return None
        if chats:
            out, counted = chats.token_files(cfg.compact, cfg.val_fraction, scratch)
            meta = dataclasses.replace(meta_of(inputs, out), train_counted=counted[0],
                                       val_counted=counted[1])
            say_conversations(chats, out)
        else:
            out = tokenize(cfg, text_path, text, scratch, breaks.finish())
            meta = meta_of(inputs, out)
        source = {
            "source": inputs.source,
            "kind": kind,
            **({"text_field": cfg.text_field} if any(d.format != "txt" for d in docs)
               and not chats else {}),
            **({"chat": chats.report()} if chats else {}),
            "documents": [doc.record() for doc in docs],
            "kept_bytes": text.nbytes,
            "sha256": inputs.corpus_sha256,
        }
        write(rundir, scratch, source, out.tokenizer, meta)
    return meta


def say_conversations(chats: Conversations, out: TokenFiles) -> None:
    """The chat path's lines of the stage's report: conversations kept and cut, the rows."""
    print(f"corpus: {chats.count:,} conversations rendered with the chat template, "
          f"{chats.cut:,} cut at a turn boundary to fit --block_size {chats.limit - 1}; "
          f"{out.tokens[0] // chats.limit:,} training and {out.tokens[1] // chats.limit:,} "
          f"validation rows of {chats.limit} tokens")
    print(f"corpus: tokenizer {describe(out.tokenizer)}")


def clean(cfg: CorpusConfig, kind: str, text_path: Path, scratch: Path,
          breaks: Breaks, chats: Conversations | None = None) -> tuple[TextFile, list[Document]]:
    """Read --source (of `kind`) cleaned into `text_path`, where its documents meet into
    `breaks`, downloads into `scratch`; say what each file gave. With `chats`, records are
    conversations it renders (and `text_path` their rendered text)."""
    reading = Progress("cleaned", source_bytes(cfg.source))
    with open(text_path, "wb") as f:
        text = TextFile(f)
        docs = read_source(cfg.source, download_of(cfg), scratch, text.write, reading.update,
                           cfg.text_field, breaks.add, chats.take if chats else None)
    reading.done()
    for doc in docs:
        print(f"corpus: read {doc.origin} ({kind}): {doc.raw_bytes:,} bytes{records(doc)}; "
              f"{removal(doc)}")
    return text, docs


def inputs_of(cfg: CorpusConfig, text: TextFile, documents: int) -> CorpusInputs:
    """What the data will be made from: the flags that shape it, the cleaned text's hash and
    how many documents it holds."""
    compacted = cfg.compact and cfg.tokenizer == "gpt2"
    return CorpusInputs(
        source=canonical(cfg.source),
        tokenizer=cfg.tokenizer,
        compact=compacted,
        # chat: every token the conversations use (gpt/data/conversations.py says why)
        max_vocab=cfg.max_vocab if compacted and not cfg.init_from and not cfg.chat else 0,
        val_fraction=cfg.val_fraction,
        block_size=cfg.block_size,
        corpus_sha256=text.sha256.hexdigest(),
        init_from=model_source.parse(cfg.init_from).canonical if cfg.init_from else "",
        documents=documents,
        chat=cfg.chat,
    )


def tokenize(cfg: CorpusConfig, text_path: Path, text: TextFile, scratch: Path,
             breaks: Path | None) -> TokenFiles:
    """The token files of the cleaned text at `text_path`, written into `scratch`, end-of-text
    where `breaks` says documents meet (a tokenizer without one keeps the blank line), long
    enough for --block_size in both splits."""
    tokenizing = Progress("tokenized", text.nbytes)
    cut = cut_at(text.chars, cfg.val_fraction)
    theirs = init_from_tokenizer(cfg)
    if isinstance(theirs, GPT2Tokenizer) and theirs.kept is None:
        # GPT-2's whole vocabulary: its tokens as GPT-2 splits the text, --compact keeping the
        # rows of those the text uses (never --max_vocab's byte fallback of rare ones).
        out = tokenize_file("gpt2", text_path, cut, cfg.compact, 0, scratch, tokenizing.update,
                            breaks)  # fmt: skip
    elif theirs is not None:  # an earlier run's vocabulary, as it is
        out = tokenize_with(theirs, text_path, cut, scratch, tokenizing.update, breaks)
    else:
        out = tokenize_file(cfg.tokenizer, text_path, cut, cfg.compact, cfg.max_vocab, scratch,
                            tokenizing.update, breaks)  # fmt: skip
    tokenizing.done()
    check_length(cfg, out)
    print(f"corpus: tokenizer {describe(out.tokenizer)}")
    if out.sample_bytes:
        print(f"corpus: its tokens counted on {out.sample_bytes:,} bytes of the text, "
              "in slices spread evenly over it")
    return out


def init_from_tokenizer(cfg: CorpusConfig) -> Tokenizer | None:
    """--init_from's tokenizer (None without one). GPT-2's four sizes share the BPE this
    project ships, so they need no download; anything else has its tokenizer files fetched
    (gpt/fetch/model_source.py). --tokenizer must name its kind."""
    if not cfg.init_from:
        return None
    if cfg.init_from in model_source.GPT2_REPOS:
        tok: Tokenizer = GPT2Tokenizer()
    else:
        fetched = model_source.fetch(cfg.init_from, cfg.root, model_source.TOKENIZER_FILES)
        tok = pretrained_tokenizer(fetched.path)
    if tok.name != cfg.tokenizer:
        raise InputError(f"--tokenizer {cfg.tokenizer}: contradicts --init_from "
                         f"{cfg.init_from!r}, whose tokenizer is {tok.name}")
    return tok


def meta_of(inputs: CorpusInputs, out: TokenFiles) -> DataMeta:
    tok = out.tokenizer
    return DataMeta(
        **dataclasses.asdict(inputs),
        vocab_size=tok.vocab_size,
        eot_id=tok.eot_id,
        dtype=dtype_for(tok.vocab_size),
        train_tokens=out.tokens[0],
        val_tokens=out.tokens[1],
        train_bytes=out.nbytes[0],
        val_bytes=out.nbytes[1],
    )


def check_length(cfg: CorpusConfig, out: TokenFiles) -> None:
    need = cfg.block_size + 1  # a block of inputs plus the next token as its last target
    train, val = out.tokens
    if train < need or val < need:
        raise InputError(
            f"--source {cfg.source!r}: corpus too short for --block_size {cfg.block_size}: "
            f"{train} training and {val} validation tokens, each split needs {need}"
        )


def source_bytes(source: str) -> int:
    """The size of a local plain-text source (for an ETA while cleaning it); 0 where it is not
    known (elsewhere, and where compression or records make the text's size another's)."""
    kind = kind_of(source)
    if kind not in ("file", "dir"):
        return 0
    files = [Path(source)] if kind == "file" else corpus_files(Path(source))
    if not files or any(format_or_text(p.name) != Format("txt") for p in files):
        return 0
    return sum(p.stat().st_size for p in files)


def download_of(cfg: CorpusConfig) -> Download:
    return Download(
        timeout=cfg.download_timeout,
        retries=cfg.download_retries,
        backoff=cfg.download_backoff,
        max_bytes=cfg.max_bytes,
    )


def up_to_date(rundir: RunDir, inputs: CorpusInputs, overwrite: bool) -> bool:
    """True if the run already holds data from exactly these inputs; refuse other inputs.

    What an interrupted write left (data/ renamed into place, corpus/ not yet, or still an
    earlier input's) is written again when the inputs are the same: that is the same command
    run again after a kill, and nothing of value is there to lose.
    """
    if not rundir.meta_json.exists():
        return False
    old = read_json_object(rundir.meta_json)
    diff = inputs.changed(old)
    if not diff:
        if whole(rundir, old):
            return not overwrite
        print(f"corpus: {rundir.path} was left incomplete by an interrupted run; writing it again")
        return False
    if overwrite:
        print(f"corpus: --overwrite: replacing the corpus and data of {rundir.path}")
        return False
    now = dataclasses.asdict(inputs)
    what = ", ".join(f"{k} {old.get(k, ADDED_INPUTS.get(k))!r} there, {now[k]!r} now" for k in diff)
    raise InputError(
        f"--run {rundir.run_id!r}: {rundir.path} already holds data from other inputs ({what}); "
        "use a new --run or pass --overwrite true"
    )


def whole(rundir: RunDir, meta: dict[str, Any]) -> bool:
    """Every output is there, and corpus/ is the text that data/ was made from (the two are
    renamed into place one after the other)."""
    if not all(p.exists() for p in outputs(rundir, meta.get("chat") is True)):
        return False
    return read_json_object(rundir.source_json).get("sha256") == meta.get("corpus_sha256")


def outputs(rundir: RunDir, chat: bool = False) -> list[Path]:
    masks = [rundir.train_mask, rundir.val_mask] if chat else []
    return [rundir.text_txt, rundir.source_json, rundir.train_bin, rundir.val_bin, *masks,
            rundir.tokenizer_json, rundir.meta_json]


def write(
    rundir: RunDir, scratch: Path, source: dict[str, Any], tok: Tokenizer, meta: DataMeta
) -> None:
    """Move the text and token files from `scratch` into place, with their descriptions."""
    # Both directories are complete before either is renamed into place (data/ first, then
    # corpus/); an error anywhere removes both staging directories.
    with (
        staged_dir(rundir.corpus_dir, what="the corpus") as corpus,
        staged_dir(rundir.data_dir, what="the token data") as data,
    ):
        os.replace(scratch / rundir.text_txt.name, corpus / rundir.text_txt.name)
        write_json(corpus / rundir.source_json.name, source, what="the corpus's source record")
        masks = (rundir.train_mask, rundir.val_mask) if meta.chat else ()
        for f in (rundir.train_bin, rundir.val_bin, *masks):
            os.replace(scratch / f.name, data / f.name)
        write_json(data / rundir.tokenizer_json.name, tok.to_json(), what="the tokenizer")
        meta.write(data / rundir.meta_json.name)


def records(doc: Document) -> str:
    """What a file of records gave: its format, documents and skipped records."""
    if doc.format.startswith("txt"):  # one document, compressed or not
        return "" if doc.format == "txt" else f", {doc.format}"
    skipped = ", ".join(f"{v:,} {k}" for k, v in doc.skipped.items())
    skipped = f" ({skipped} skipped)" if skipped else ""
    return f", {doc.format}: {doc.documents:,} documents{skipped}"


def removal(doc: Document) -> str:
    if not doc.removed:
        return "cleaning removed nothing"
    parts = ", ".join(f"{k} {v:,}" for k, v in doc.removed.items())
    return f"cleaned ({parts}); kept {doc.kept_bytes:,} bytes"


def describe(tok: Tokenizer) -> str:
    markers = " and the 2 chat markers" if tok.chat else ""
    if isinstance(tok, GPT2Tokenizer) and tok.kept is not None:
        return f"gpt2 compacted to {tok.base_size():,} of {tok.enc.n_vocab:,} tokens{markers}"
    return f"{tok.name}, vocabulary {tok.vocab_size:,}{markers}"
