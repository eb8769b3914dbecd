"""Tokenizers: GPT-2 BPE built offline (full and compacted) and characters; exact round trips."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt.errors import InputError
from gpt.tokenizer import (
    GPT2_EOT,
    RANKS_SHA256,
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    load_tokenizer,
    read_ranks,
    tokenizer_from_json,
)

COMEDY = (resources.files("gpt.assets") / "comedy_of_errors.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def full() -> GPT2Tokenizer:
    return GPT2Tokenizer()


@pytest.fixture(scope="module")
def compact() -> GPT2Tokenizer:
    return GPT2Tokenizer.fit([COMEDY])


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.fit([COMEDY])


def test_gpt2_matches_the_published_vocabulary(full: GPT2Tokenizer) -> None:
    # Ids from OpenAI's GPT-2 encoder: a wrong ranks file or split pattern changes them.
    assert full.encode("Hello world") == [15496, 995]
    assert full.encode(" the") == [262]
    assert (full.vocab_size, full.eot_id) == (50257, GPT2_EOT)
    # A typed "<|endoftext|>" is plain text, never the special token, so it round-trips.
    assert GPT2_EOT not in full.encode("a<|endoftext|>b")


def test_gpt2_is_built_offline_without_tiktoken_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    code = textwrap.dedent(
        """
        import socket
        def refuse(*a, **k):
            raise AssertionError("network used")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from gpt.tokenizer import GPT2Tokenizer
        print(GPT2Tokenizer().encode("Hello world"))
        """
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[15496, 995]"
    assert list(cache.iterdir()) == []


def test_damaged_ranks_file_is_refused(tmp_path: Path) -> None:
    shipped = resources.files("gpt.assets") / "r50k_base.tiktoken.gz"
    data = gzip.decompress(shipped.read_bytes())
    bad = tmp_path / "r50k_base.tiktoken.gz"
    bad.write_bytes(gzip.compress(data.replace(b"IQ== 0", b"IQ== 9", 1)))
    with pytest.raises(RuntimeError, match="sha256"):
        read_ranks(bad)


@settings(max_examples=80, deadline=None)
@given(st.text())
def test_gpt2_round_trips_any_text(full: GPT2Tokenizer, compact: GPT2Tokenizer, s: str) -> None:
    for tok in (full, compact):
        ids = tok.encode(s)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == s
        assert b"".join(tok.decode_bytes([i]) for i in ids) == s.encode("utf-8")
        assert tok.encode_lossy(s) == (ids, [])


def test_compaction_keeps_corpus_tokens_bytes_and_eot(
    full: GPT2Tokenizer, compact: GPT2Tokenizer
) -> None:
    corpus_ids = full.encode(COMEDY)
    byte_ids = {full.enc.encode_single_token(bytes([b])) for b in range(256)}
    assert compact.kept == sorted(set(corpus_ids) | byte_ids | {GPT2_EOT})
    assert compact.vocab_size == len(compact.kept) < full.vocab_size
    # On its own corpus compaction only renumbers: same tokens, same count, dense ids.
    ids = compact.encode(COMEDY)
    assert [compact.kept[i] for i in ids] == corpus_ids
    assert compact.decode([compact.eot_id]) == "<|endoftext|>"


def test_compaction_respells_unseen_tokens_with_kept_ones(
    full: GPT2Tokenizer, compact: GPT2Tokenizer
) -> None:
    word = " quantum"  # one GPT-2 token, never in the Comedy of Errors
    assert len(full.encode(word)) == 1
    assert full.encode(word)[0] not in compact.kept
    ids = compact.encode(word)
    assert compact.decode(ids) == word
    # Merged as far as kept tokens allow: fewer tokens than bytes, and no two neighbours that
    # form a kept token (restricted BPE stops only then).
    parts = [compact.decode_bytes([i]) for i in ids]
    assert 1 < len(ids) < len(word.encode("utf-8"))
    kept = {compact.decode_bytes([i]) for i in range(compact.vocab_size)}
    assert all(a + b not in kept for a, b in zip(parts, parts[1:], strict=False))


def test_with_only_bytes_kept_every_token_is_spelt_in_bytes(full: GPT2Tokenizer) -> None:
    bytes_only = GPT2Tokenizer.fit([""])
    assert bytes_only.vocab_size == 257  # 256 bytes + end-of-text
    word = " Ephesus"
    assert [bytes_only.decode_bytes([i]) for i in bytes_only.encode(word)] == [
        bytes([b]) for b in word.encode("utf-8")
    ]


def test_max_vocab_keeps_the_most_frequent_tokens(full: GPT2Tokenizer) -> None:
    counts = Counter(full.encode(COMEDY))
    capped = GPT2Tokenizer.fit([COMEDY], max_vocab=1000)
    assert capped.vocab_size == 1000
    required = {full.enc.encode_single_token(bytes([b])) for b in range(256)} | {GPT2_EOT}
    assert required <= set(capped.kept)
    chosen = [counts[g] for g in capped.kept if g not in required]
    dropped = [n for g, n in counts.items() if g not in capped.kept]
    assert len(chosen) == 1000 - len(required) and dropped
    assert min(chosen) >= max(dropped)
    # Dropped tokens are re-spelt: exact round trip, more tokens than uncapped, far fewer than
    # bytes.
    ids = capped.encode(COMEDY)
    assert capped.decode(ids) == COMEDY
    assert len(full.encode(COMEDY)) < len(ids) < len(COMEDY.encode("utf-8")) / 2


def test_max_vocab_below_the_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="max_vocab 256: must be 0 .* or >= 257"):
        GPT2Tokenizer.fit([COMEDY], max_vocab=256)


def test_char_round_trip_and_unknown_characters_are_reported(char: CharTokenizer) -> None:
    assert char.vocab_size == len(set(COMEDY))
    assert char.eot_id is None
    assert char.decode(char.encode(COMEDY)) == COMEDY
    with pytest.raises(ValueError, match="ß") as err:
        char.encode("Straße ~")
    assert "~" in str(err.value)
    ids, replaced = char.encode_lossy("aß~b")
    assert replaced == ["ß", "~"]
    assert len(ids) == 4 and char.decode(ids) == "a??b"


def test_decode_refuses_ids_outside_the_vocabulary(
    char: CharTokenizer, compact: GPT2Tokenizer
) -> None:
    for tok in (char, compact):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([tok.vocab_size])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([-1])


@pytest.mark.parametrize("kind", ["full", "compact", "char"])
def test_json_rebuilds_the_same_tokenizer(kind: str, request, tmp_path: Path) -> None:
    tok: Tokenizer = request.getfixturevalue(kind)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tok.to_json()))
    again = load_tokenizer(path)
    assert (again.name, again.vocab_size, again.eot_id) == (tok.name, tok.vocab_size, tok.eot_id)
    sample = COMEDY[:2000] + " quantum"
    assert again.encode_lossy(sample) == tok.encode_lossy(sample)


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "not a valid tokenizer file"),
        ('{"name": "sentencepiece"}', "expected 'gpt2' or 'char'"),
        ('{"name": "gpt2", "ranks_sha256": "0000"}', "not the shipped GPT-2 BPE"),
        ('{"name": "gpt2", "ranks_sha256": "%s", "kept": [0, 1]}', "256 single-byte"),
        ('{"name": "char", "chars": "aa"}', "distinct"),
        ('{"name": "char", "chars": "ab", "vocab_size": 3}', "vocab_size"),
    ],
)
def test_bad_tokenizer_file_is_an_input_error(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(content.replace("%s", RANKS_SHA256))
    with pytest.raises(InputError, match=reason) as err:
        load_tokenizer(path)
    assert str(path) in str(err.value)


def test_missing_tokenizer_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "absent.json")
    with pytest.raises(ValueError):
        tokenizer_from_json([])  # type: ignore[arg-type]
