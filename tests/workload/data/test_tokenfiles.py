"""Token files: a text tokenized in chunks holds exactly the ids of its whole parts."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from support.corpora import ids_between, joined, split_documents

import gpt.data.tokenfiles
from gpt.data.tokenfiles import SAFE_CUT, _at_cuts, chunks, tokenize_file
from gpt.tokenizer.compaction import always_kept, piece_cuts
from gpt.tokenizer.kinds import CharTokenizer, GPT2Tokenizer
from gpt.tokenizer.ranks import gpt2_encoding

COMEDY = (resources.files("gpt.assets") / "comedy_of_errors.txt").read_text(encoding="utf-8")
# What a pre-tokenizer could trip on at a cut: runs of spaces and newlines, digits, contractions,
# punctuation, letters outside ASCII, characters outside the BMP, and "<|endoftext|>" as text.
ODD = (
    "It's 12,345 o'clock.\n\n\n  Then   two spaces\n \nTAB\there\r\nCRLF\n"
    "café\nnaïve 中文文本\n中文\n😀 emoji\n\n<|endoftext|>\nthey'll've  \n" * 40
)


# No whitespace, so no piece cut: its ids are carried from chunk to chunk into one part.
NO_CUTS = "東京都は日本の首都です。中文文本，汉字混合。" * 50


def ids_of(folder: Path, dtype: str = "uint16") -> list[list[int]]:
    return [np.fromfile(folder / f"{s}.bin", dtype=dtype).tolist() for s in ("train", "val")]


@pytest.mark.parametrize("size", [64, 1000, 1 << 20])
@pytest.mark.parametrize("text", [COMEDY, ODD], ids=["comedy", "odd"])
def test_gpt2_chunks_hold_the_whole_parts_ids(
    text: str, size: int, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", size)
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8", newline="")
    cut = int(len(text) * 0.9)
    out = tokenize_file("gpt2", path, cut, compact=False, max_vocab=0, out=tmp_path)
    enc = gpt2_encoding()
    expected = [enc.encode_ordinary(text[:cut]), enc.encode_ordinary(text[cut:])]
    assert ids_of(tmp_path) == expected
    assert out.tokens == tuple(map(len, expected))
    assert out.nbytes == (len(text[:cut].encode()), len(text[cut:].encode()))
    if size == 64:
        assert len(list(chunks(path, cut, safe=True))) > 20  # it was cut, and still matches


@pytest.mark.parametrize("max_vocab", [0, 257, 300, 1000, 3000])
@pytest.mark.parametrize("id_chunk", [37, 1000])
def test_compacted_ids_are_what_the_fitted_tokenizer_encodes(
    max_vocab: int, id_chunk: int, tmp_path: Path, monkeypatch
) -> None:
    # Where max_vocab drops tokens the pieces holding them are encoded again: the ids are still
    # exactly what the tokenizer encodes, however the ids were chunked.
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", 4096)
    monkeypatch.setattr(gpt.data.tokenfiles, "ID_CHUNK", id_chunk)
    text = COMEDY + NO_CUTS + ODD
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8", newline="")
    cut = len(text) // 2
    out = tokenize_file("gpt2", path, cut, compact=True, max_vocab=max_vocab, out=tmp_path)
    parts = [text[:cut], text[cut:]]
    tok = GPT2Tokenizer.fit(parts, max_vocab)
    assert out.tokenizer.to_json() == tok.to_json()
    assert ids_of(tmp_path) == [tok.encode(p) for p in parts]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt", "train.bin", "val.bin"]


@pytest.mark.parametrize("max_vocab", [300, 1000])
def test_a_large_capped_text_is_encoded_with_a_vocabulary_counted_on_a_spread_sample(
    max_vocab: int, tmp_path: Path, monkeypatch
) -> None:
    # Scaled down: 64 slices of 512 bytes, for texts above 128 KB. The text's head is English
    # (and ODD), its tail Japanese and Chinese without a newline: slices from the head alone
    # would miss the tail's tokens (no English token's merge parts are among them).
    monkeypatch.setattr(gpt.data.tokenfiles, "VOCAB_SAMPLE_BYTES", 64 * 512)
    monkeypatch.setattr(gpt.data.tokenfiles, "SAMPLED_ABOVE", 128 * 1024)
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", 4096)
    head, tail = COMEDY * 2 + ODD, NO_CUTS * 40
    text = head + tail
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8", newline="")
    assert path.stat().st_size > gpt.data.tokenfiles.SAMPLED_ABOVE
    cut = int(len(text) * 0.9)
    out = tokenize_file("gpt2", path, cut, compact=True, max_vocab=max_vocab, out=tmp_path)
    tok = out.tokenizer
    assert isinstance(tok, GPT2Tokenizer) and tok.vocab_size <= max_vocab
    parts = [text[:cut], text[cut:]]
    assert ids_of(tmp_path) == [tok.encode(p) for p in parts]  # exactly what it encodes
    assert out.nbytes == tuple(len(p.encode()) for p in parts)
    assert 0 < out.sample_bytes <= 64 * 512
    enc = gpt2_encoding()
    tail_only = set(enc.encode_ordinary(tail)) - set(enc.encode_ordinary(head)) - always_kept()
    assert tail_only and tail_only <= set(tok.kept)
    # Counted on the sample, not on the whole text: the exact fit differs.
    assert tok.kept != GPT2Tokenizer.fit(parts, max_vocab).kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt", "train.bin", "val.bin"]


def test_char_ids(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", 100)
    path = tmp_path / "text.txt"
    path.write_text(ODD, encoding="utf-8", newline="")
    out = tokenize_file("char", path, 1234, compact=True, max_vocab=0, out=tmp_path)
    tok = CharTokenizer.fit([ODD])
    assert out.tokenizer.to_json() == tok.to_json()
    assert ids_of(tmp_path) == [tok.encode(ODD[:1234]), tok.encode(ODD[1234:])]


def test_safe_cuts_are_where_pieces_end_anyway() -> None:
    enc = gpt2_encoding()
    for m in SAFE_CUT.finditer(ODD):
        k = m.start()
        assert enc.encode_ordinary(ODD[:k]) + enc.encode_ordinary(ODD[k:]) == (
            enc.encode_ordinary(ODD)
        ), repr(ODD[k - 5 : k + 5])


@pytest.mark.parametrize("size", [1, 7, 100, 1 << 20])
def test_id_parts_end_where_pieces_do(size: int) -> None:
    enc = gpt2_encoding()
    ids = np.array(enc.encode_ordinary(ODD + NO_CUTS + ODD), dtype=np.uint16)
    assert not piece_cuts(np.array(enc.encode_ordinary(NO_CUTS))).size
    parts = list(_at_cuts(ids[i : i + size] for i in range(0, len(ids), size)))
    assert np.concatenate(parts).tolist() == ids.tolist()
    cuts = set(piece_cuts(ids).tolist())
    ends = np.cumsum([len(p) for p in parts]).tolist()
    assert set(ends[:-1]) <= cuts and ends[-1] == len(ids)
    assert all(len(p) for p in parts)
    assert len(parts) > 10 if size < len(ids) else len(parts) == 2  # up to the last cut, rest


def test_unknown_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValueError, match="expected gpt2 or char"):
        tokenize_file("bpe", tmp_path / "t.txt", 0, False, 0, tmp_path)


# -- documents: end-of-text between them, each encoded on its own

# Documents whose edges would merge if encoded as one text: a word ending one and a word
# starting the next, spaces on both sides, "<|endoftext|>" spelt as text, characters outside
# ASCII, a document of one character.
DOCS = [
    COMEDY[:3000] + " xyzzyplugh",
    "eQuuxwobble starts without a space",
    "  two spaces ahead, and behind  ",
    "\nx\n",
    ODD[:700],
    "中文文本",
    "y",
    COMEDY[3000:12000],
]


def separator_cuts() -> list[int]:
    """Cuts at each spot a separator can be: inside a document, at a separator's start, in
    the middle of it, at its end (the next document's start)."""
    at = sum(len(d) + 2 for d in DOCS[:5])  # DOCS[5] starts here
    return [at - 2, at - 1, at, at + 1, len(COMEDY) // 40]


@pytest.mark.parametrize("size", [64, 1 << 20])
@pytest.mark.parametrize("cut", separator_cuts())
def test_documents_are_encoded_apart_with_end_of_text_between_them(
    cut: int, size: int, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", size)
    monkeypatch.setattr(gpt.data.tokenfiles, "OFFSETS", 3)  # the offsets read in three goes
    path, breaks = joined(DOCS, tmp_path)
    out = tokenize_file("gpt2", path, cut, compact=False, max_vocab=0, out=tmp_path,
                        breaks=breaks)  # fmt: skip
    enc = gpt2_encoding()
    expected = [ids_between(docs, enc.encode_ordinary, enc.eot_token)
                for docs in split_documents(DOCS, cut)]  # fmt: skip
    assert ids_of(tmp_path) == expected
    for ids in expected:  # between documents only, never at a split's start or end
        assert ids[0] != enc.eot_token != ids[-1]
    assert sum(ids.count(enc.eot_token) for ids in expected) >= len(DOCS) - 2
    text = path.read_bytes().decode()
    assert out.nbytes == (len(text[:cut].encode()), len(text[cut:].encode()))


@pytest.mark.parametrize("docs", [
    # one call encodes a chunk's documents joined by end-of-text: text that spells part of it
    # at a document's edge stays text
    ["ends <|endoftext|", "> starts", "<|endoftext", "|>", "plain"],
    # a chunk with "<|endoftext|>" spelt inside a document is encoded a document at a time
    ["plain", "holds <|endoftext|> as text", "<|endoftext|>", "tail"],
], ids=["at-edges", "inside"])  # fmt: skip
def test_end_of_text_spelt_in_a_document_is_text(docs: list[str], tmp_path: Path) -> None:
    path, breaks = joined(docs, tmp_path)
    text = path.read_bytes().decode()
    tokenize_file("gpt2", path, len(text), compact=False, max_vocab=0, out=tmp_path,
                  breaks=breaks)  # fmt: skip
    enc = gpt2_encoding()
    assert ids_of(tmp_path)[0] == ids_between(docs, enc.encode_ordinary, enc.eot_token)


@pytest.mark.parametrize("sampled", [False, True], ids=["exact", "sampled"])
@pytest.mark.parametrize("max_vocab", [0, 300])
def test_compacted_documents_hold_the_compact_end_of_text(
    max_vocab: int, sampled: bool, tmp_path: Path, monkeypatch
) -> None:
    # max_vocab 300 drops tokens on both sides of a separator (of "xyzzyplugh" and
    # "eQuuxwobble"): the pieces holding them are encoded again, each document's apart (as one
    # text, "he" would merge across it).
    monkeypatch.setattr(gpt.data.tokenfiles, "CHUNK_CHARS", 512)
    monkeypatch.setattr(gpt.data.tokenfiles, "ID_CHUNK", 100)
    if sampled:
        monkeypatch.setattr(gpt.data.tokenfiles, "VOCAB_SAMPLE_BYTES", 64 * 128)
        monkeypatch.setattr(gpt.data.tokenfiles, "SAMPLED_ABOVE", 1024)
    path, breaks = joined(DOCS, tmp_path)
    cut = int(len(path.read_bytes().decode()) * 0.9)
    out = tokenize_file("gpt2", path, cut, compact=True, max_vocab=max_vocab, out=tmp_path,
                        breaks=breaks)  # fmt: skip
    tok = out.tokenizer
    assert isinstance(tok, GPT2Tokenizer) and tok.eot_id < tok.vocab_size
    splits = split_documents(DOCS, cut)
    if not sampled:
        assert tok.kept == GPT2Tokenizer.fit([*splits[0], *splits[1]], max_vocab).kept
    assert ids_of(tmp_path) == [ids_between(docs, tok.encode, tok.eot_id) for docs in splits]


def test_characters_keep_the_blank_line_between_documents(tmp_path: Path) -> None:
    path, breaks = joined(DOCS, tmp_path)
    text = path.read_bytes().decode()
    out = tokenize_file("char", path, 1234, compact=True, max_vocab=0, out=tmp_path,
                        breaks=breaks)  # fmt: skip
    tok = out.tokenizer
    assert tok.eot_id is None
    assert ids_of(tmp_path) == [tok.encode(text[:1234]), tok.encode(text[1234:])]


def test_end_of_text_is_a_cut_of_its_own() -> None:
    # Either side of end-of-text is a cut, though neither is whitespace: documents are apart.
    enc = gpt2_encoding()
    ids = np.array(enc.encode_ordinary("ab") + [enc.eot_token] + enc.encode_ordinary("cd"))
    assert piece_cuts(ids).tolist() == [1, 2]
    assert piece_cuts(np.array([enc.eot_token, *enc.encode_ordinary("a b")])).tolist() == [1, 2]
    # never the text's own start or end; two ends-of-text in a row, a piece each
    assert piece_cuts(np.array([*enc.encode_ordinary("a b"), enc.eot_token])).tolist() == [1, 2]
    eot = enc.eot_token
    assert piece_cuts(np.array([*enc.encode_ordinary("ab"), eot, eot])).tolist() == [1, 2]


def test_the_corpus_stage_encodes_on_one_thread_per_usable_core(monkeypatch) -> None:
    sizes: list[int] = []

    def recording(workers: int) -> ThreadPoolExecutor:
        sizes.append(workers)
        return ThreadPoolExecutor(workers)

    monkeypatch.setattr(gpt.data.tokenfiles, "ThreadPoolExecutor", recording)
    monkeypatch.setattr(gpt.data.tokenfiles, "usable_cores", lambda: 3)
    assert list(gpt.data.tokenfiles._in_order(lambda x: x * 2, range(10))) == list(range(0, 20, 2))
    assert sizes == [3]


def test_new_threads_take_over_every_thread_items_and_the_order_holds(monkeypatch) -> None:
    monkeypatch.setattr(gpt.data.tokenfiles, "THREAD_ITEMS", 2)
    monkeypatch.setattr(gpt.data.tokenfiles, "usable_cores", lambda: 2)  # 2 x 2 items a pool

    def work(i: int) -> tuple[int, str]:
        time.sleep(0.01 * (i % 3))  # items finish out of order
        return i, threading.current_thread().name  # "ThreadPoolExecutor-<pool>_<thread>"

    done = list(gpt.data.tokenfiles._in_order(work, range(10)))
    assert [i for i, _ in done] == list(range(10))
    pools = [name.rsplit("_", 1)[0] for _, name in done]
    assert len(set(pools[:4])) == len(set(pools[4:8])) == len(set(pools[8:])) == 1
    assert len(set(pools)) == 3  # items 0-3, 4-7, 8-9: three pools, none sharing a thread


def test_a_failing_item_stops_the_rest(monkeypatch) -> None:
    monkeypatch.setattr(gpt.data.tokenfiles, "THREAD_ITEMS", 2)
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        if i == 5:
            raise ValueError("item 5")
        return i

    with pytest.raises(ValueError, match="item 5"):
        list(gpt.data.tokenfiles._in_order(work, range(1000)))
    # Items in flight beside it may still start; nothing after them is taken.
    assert 5 in started and max(started) < 5 + 2 * gpt.data.tokenfiles.usable_cores() + 1
