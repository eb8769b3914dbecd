"""Tokenizers: GPT-2 BPE built offline (full and compacted) and characters; exact round trips,
and Hugging Face twins that give the same ids."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt.errors import InputError
from gpt.tokenizer.compaction import always_kept, merge_closure, piece_cuts
from gpt.tokenizer.huggingface import byte_alphabet, hf_tokenizer, tokenizer_from_hf
from gpt.tokenizer.kinds import (
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from gpt.tokenizer.ranks import (
    ENDOFTEXT,
    GPT2_EOT,
    RANKS_SHA256,
    gpt2_tokens,
    merge_parts,
    read_ranks,
)

COMEDY = (resources.files("gpt.assets") / "comedy_of_errors.txt").read_text(encoding="utf-8")
ENGLISH = (
    "The committee reviewed quarterly telemetry from 1,024 satellites; its report, released on "
    "Tuesday, recommends replacing the propulsion firmware before the 2031 launch window.\n"
    "Engineers disagreed: 'We'll need another audit,' said Dr. Okonkwo, 'and it isn't cheap.'\n"
)
UNICODE = "Straße, naïve café, Ωμέγα, Привет мир, עברית, العربية, हिन्दी, ÅÉÎÕÜ ﬁ ½ ∑∫√ ‰"
EMOJI = "Rockets 🚀🚀 and flags 🇯🇵 and families 👨‍👩‍👧 and skin tones 👋🏽!"
CJK = "東京都は日本の首都です。\n中文文本，汉字混合。한국어 문장도 있습니다。"
CRLF = "first line\r\nsecond line\r\n\r\nthird\r\n"
SPACES = "a" + " " * 17 + "b\t\t\t c \n\n\n\n    d  \n  \t \u3000\u00a0 e   " + "\n" * 9
SAMPLES = [COMEDY, ENGLISH, UNICODE, EMOJI, CJK, CRLF, SPACES, ""]


@pytest.fixture(scope="module")
def full() -> GPT2Tokenizer:
    return GPT2Tokenizer()


@pytest.fixture(scope="module")
def compact() -> GPT2Tokenizer:
    return GPT2Tokenizer.fit([COMEDY])


@pytest.fixture(scope="module")
def capped() -> GPT2Tokenizer:
    return GPT2Tokenizer.fit([COMEDY], max_vocab=1000)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.fit([COMEDY])


def closed(tok: GPT2Tokenizer) -> bool:
    kept = set(tok.kept)
    return all(kept.issuperset(merge_parts(g) or ()) for g in tok.kept)


def test_gpt2_matches_the_published_vocabulary(full: GPT2Tokenizer) -> None:
    # Ids from OpenAI's GPT-2 encoder: a wrong ranks file or split pattern changes them.
    assert full.encode("Hello world") == [15496, 995]
    assert full.encode(" the") == [262]
    assert (full.vocab_size, full.eot_id) == (50257, GPT2_EOT)
    # A typed "<|endoftext|>" is plain text, never the special token, so it round-trips.
    assert GPT2_EOT not in full.encode("a<|endoftext|>b")


@pytest.mark.process
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
        from gpt.tokenizer.kinds import GPT2Tokenizer
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


def test_compaction_keeps_corpus_tokens_bytes_eot_and_their_merge_parts(
    full: GPT2Tokenizer, compact: GPT2Tokenizer
) -> None:
    corpus_ids = full.encode(COMEDY)
    byte_ids = {full.enc.encode_single_token(bytes([b])) for b in range(256)}
    wanted = set(corpus_ids) | byte_ids | {GPT2_EOT}
    # The corpus's tokens and every token BPE passes through to build them, nothing else.
    closure = set().union(*(merge_closure(g, set()) for g in wanted))
    assert compact.kept == sorted(closure)
    assert closed(compact) and len(closure) > len(wanted)
    assert compact.vocab_size == len(compact.kept) < full.vocab_size
    # On its own corpus compaction only renumbers: same tokens, same count, dense ids.
    ids = compact.encode(COMEDY)
    assert [compact.kept[i] for i in ids] == corpus_ids
    assert compact.decode([compact.eot_id]) == "<|endoftext|>"


def test_every_gpt2_token_is_merged_from_two_lower_ranked_ones() -> None:
    tokens = gpt2_tokens()
    for g in range(GPT2_EOT):
        parts = merge_parts(g)
        if len(tokens[g]) == 1:
            assert parts is None
        else:
            a, b = parts
            assert tokens[a] + tokens[b] == tokens[g] and a < g and b < g
    assert merge_parts(GPT2_EOT) is None


def test_an_unclosed_vocabulary_is_refused(compact: GPT2Tokenizer) -> None:
    # e.g. a tokenizer.json written before merge closure: its BPE would not be GPT-2's
    part = next(p for g in compact.kept for p in merge_parts(g) or () if p not in always_kept())
    with pytest.raises(ValueError, match="lacks its merge parts"):
        GPT2Tokenizer([g for g in compact.kept if g != part])


def test_compaction_spells_unseen_tokens_with_kept_ones(
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


def test_max_vocab_keeps_the_most_frequent_tokens(full: GPT2Tokenizer, capped) -> None:
    counts = Counter(full.encode(COMEDY))
    assert capped.vocab_size == 1000 and closed(capped)
    assert always_kept() <= set(capped.kept)
    # Most frequent first, each with its merge parts: the head of the ranking is all kept, and
    # what is dropped is rarer than it.
    ranking = sorted(counts, key=lambda g: (-counts[g], g))
    head = ranking[: ranking.index(next(g for g in ranking if g not in capped.kept))]
    assert len(head) > 500 and set(head) <= set(capped.kept)
    dropped = [counts[g] for g in ranking if g not in capped.kept]
    assert dropped and max(dropped) <= counts[head[-1]]
    # Dropped tokens are spelt with kept ones: exact round trip, more tokens than uncapped, far
    # fewer than bytes.
    ids = capped.encode(COMEDY)
    assert capped.decode(ids) == COMEDY
    assert len(full.encode(COMEDY)) < len(ids) < len(COMEDY.encode("utf-8")) / 2


@pytest.mark.parametrize("max_vocab", [257, 258, 300, 777, 2000, 4000, 10_000])
def test_max_vocab_is_a_bound_and_the_vocabulary_stays_closed(max_vocab: int) -> None:
    tok = GPT2Tokenizer.fit([COMEDY, UNICODE, CJK], max_vocab=max_vocab)
    assert len(always_kept()) <= tok.vocab_size <= max_vocab and closed(tok)
    for text in (COMEDY[:3000], UNICODE, CJK):
        assert tok.decode(tok.encode(text)) == text


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


@pytest.mark.parametrize("kind", ["full", "compact", "capped", "char"])
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
        (
            '{"name": "gpt2", "ranks_sha256": "%s", "kept": [%k]}',
            "GPT-2 token 262 lacks its merge parts",
        ),
        ('{"name": "char", "chars": "aa"}', "distinct"),
        ('{"name": "char", "chars": "ab", "vocab_size": 3}', "vocab_size"),
    ],
)
def test_bad_tokenizer_file_is_an_input_error(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "tokenizer.json"
    # %k: the bytes, end-of-text and " the" (262), without " t" (256) it is merged from
    bytes_eot_the = sorted(always_kept() | {262})
    path.write_text(content.replace("%s", RANKS_SHA256).replace("%k", str(bytes_eot_the)[1:-1]))
    with pytest.raises(InputError, match=reason) as err:
        load_tokenizer(path)
    assert str(path) in str(err.value)


def test_missing_tokenizer_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "absent.json")
    with pytest.raises(ValueError):
        tokenizer_from_json([])  # type: ignore[arg-type]


# What a pre-tokenizer could trip on: whitespace runs and kinds, CRLF, digits, contractions,
# punctuation, letters outside ASCII, characters outside the BMP, end-of-text as text.
TRICKY = st.lists(
    st.sampled_from(
        [
            *"ab Zé中😀1'.,\t\n\r\v\f",
            "\xa0",
            "\u3000",
            "\x85",
            "\u2028",
            "\x1c",
            "'s",
            "'ll",
            "\r\n",
        ]
    )
).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(), TRICKY))
def test_restricted_bpe_on_a_closed_vocabulary_is_gpt2_renumbered(
    full: GPT2Tokenizer, s: str
) -> None:
    # The lemma compaction rests on: fitted to a text, BPE over the merge-closed vocabulary
    # makes GPT-2's merges (by induction over them: each token GPT-2 forms is kept, so the
    # lowest-ranked kept pair is GPT-2's lowest-ranked pair).
    tok = GPT2Tokenizer.fit([s])
    assert [tok.kept[i] for i in tok.encode(s)] == full.encode(s)


def test_restricted_bpe_renumbers_the_fitting_corpus(full, compact) -> None:
    ids = np.array(full.encode(COMEDY))
    assert compact.covers(ids)
    assert (
        compact.encode(COMEDY)
        == compact.compact_ids(ids).tolist()
        == [compact.kept.index(g) for g in ids.tolist()]
    )


@settings(max_examples=150, deadline=None)
@given(TRICKY)
def test_pieces_cut_where_word_meets_whitespace_encode_alone(full: GPT2Tokenizer, s: str) -> None:
    ids = np.array(full.encode(s), dtype=np.int64)
    bounds = [0, *piece_cuts(ids).tolist(), len(ids)]
    text = [full.decode(ids[a:b].tolist()) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert "".join(text) == s
    assert [i for part in text for i in full.encode(part)] == ids.tolist()


def test_no_cut_after_whitespace(full: GPT2Tokenizer) -> None:
    # Where whitespace other than a space meets a word, the pattern ends a piece too, but the
    # left side does not encode alone alike: "\s++$" takes a trailing run whole.
    assert full.encode("a\n\nb") == full.encode("a") + [198, 198] + full.encode("b")
    assert full.encode("a\n\n") == full.encode("a") + [628]
    assert piece_cuts(np.array(full.encode("a\n\nb"))).tolist() == [1]


# Words whose tokens a small max_vocab drops, next to every kind of whitespace and Unicode.
DROPPING = (
    "Ephesus\nSyracusa\tAntipholus\r\nDromio  \nAdriana \n\nLuciana\t\tAemilia\r\n\r\n"
    "merchant   \nSolinus\u00a0courtesan\u3000Pinch, Angelo; Balthazar's \x0bgoldsmith\x0c"
    "café Ephesus中文 😀Syracusa 東京 Dromio\n  \n" + CJK + CRLF + SPACES + UNICODE + EMOJI
)


@pytest.mark.parametrize("max_vocab", [257, 300, 600, 1000, 3000])
def test_compact_ids_are_what_encode_gives_where_max_vocab_drops_tokens(
    full: GPT2Tokenizer, max_vocab: int
) -> None:
    tok = GPT2Tokenizer.fit([COMEDY], max_vocab)
    for text in (DROPPING * 3, COMEDY + DROPPING, ENGLISH, "Ephesus"):
        ids = np.array(full.encode(text), dtype=np.int64)
        assert not tok.covers(ids)
        assert tok.compact_ids(ids).tolist() == tok.encode(text)
    # and so on any part of a text cut at cuts
    ids = np.array(full.encode(DROPPING * 3), dtype=np.int64)
    cuts = piece_cuts(ids).tolist()
    for a, b in [(0, cuts[10]), (cuts[3], cuts[-5]), (cuts[len(cuts) // 2], len(ids))]:
        assert tok.compact_ids(ids[a:b]).tolist() == tok.encode(full.decode(ids[a:b].tolist()))


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(), TRICKY))
def test_compact_ids_are_what_encode_gives_on_any_text(
    full: GPT2Tokenizer, capped: GPT2Tokenizer, s: str
) -> None:
    ids = np.array(full.encode(s), dtype=np.int64)
    assert capped.compact_ids(ids).tolist() == capped.encode(s)


@pytest.fixture(scope="module")
def twins(full, compact, capped, char) -> dict[str, tuple[Tokenizer, object]]:
    small = GPT2Tokenizer.fit([COMEDY, *SAMPLES], max_vocab=300)
    toks = {"full": full, "compact": compact, "capped": capped, "small": small, "char": char}
    return {name: (tok, hf_tokenizer(tok)) for name, tok in toks.items()}


def expressible(tok: Tokenizer, text: str) -> bool:
    return not isinstance(tok, CharTokenizer) or set(text) <= set(tok.chars)


@pytest.mark.parametrize("name", ["full", "compact", "capped", "small", "char"])
def test_the_hugging_face_twin_gives_the_same_ids(twins, name: str) -> None:
    tok, hf = twins[name]
    unicode_char = CharTokenizer.fit(SAMPLES)
    for text in SAMPLES + [ENGLISH * 3, COMEDY[:5000] + UNICODE + CJK]:
        for ours, theirs in [(tok, hf), (unicode_char, hf_tokenizer(unicode_char))]:
            if expressible(ours, text):
                ids = ours.encode(text)
                assert theirs.encode(text).ids == ids, (name, text[:40])
                assert theirs.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(s=st.one_of(st.text(), TRICKY, st.text(st.sampled_from(sorted(set(COMEDY))))))
def test_the_hugging_face_twin_gives_the_same_ids_on_any_text(twins, s: str) -> None:
    for tok, hf in twins.values():
        if expressible(tok, s) and ENDOFTEXT not in s:
            ids = tok.encode(s)
            assert hf.encode(s).ids == ids
            assert hf.decode(ids) == s


def test_the_twin_knows_end_of_text_as_special(twins) -> None:
    # Hugging Face matches a typed "<|endoftext|>" as the special token (as its own GPT-2 does)
    # unless told not to; ours never does. The token itself decodes alike.
    for name in ("full", "capped"):
        tok, hf = twins[name]
        text = f"a{ENDOFTEXT}b"
        assert hf.encode(text).ids == tok.encode("a") + [tok.eot_id] + tok.encode("b")
        hf.encode_special_tokens = True
        try:
            assert hf.encode(text).ids == tok.encode(text)
        finally:
            hf.encode_special_tokens = False
        assert hf.decode([tok.eot_id], skip_special_tokens=False) == tok.decode([tok.eot_id])


def test_the_twin_is_byte_level_bpe_in_gpt2_s_alphabet(twins) -> None:
    from tokenizers.pre_tokenizers import ByteLevel

    assert set(byte_alphabet()) == set(ByteLevel.alphabet()) and len(set(byte_alphabet())) == 256
    _, hf = twins["full"]
    assert hf.get_vocab_size() == 50257 and hf.token_to_id("Ġthe") == 262
    assert hf.token_to_id(ENDOFTEXT) == GPT2_EOT


@pytest.mark.parametrize("name", ["full", "compact", "capped", "small", "char"])
def test_the_twin_rebuilds_the_same_tokenizer(twins, name: str) -> None:
    tok, hf = twins[name]
    again = tokenizer_from_hf(json.loads(hf.to_str()))
    assert again.to_json() == tok.to_json()


def hf_json(tok: Tokenizer) -> dict:
    return json.loads(hf_tokenizer(tok).to_str())


def _reversed_merges(obj: dict) -> None:
    obj["model"]["merges"] = obj["model"]["merges"][::-1]


def _no_model(obj: dict) -> None:
    obj.clear()
    obj["version"] = "1.0"


@pytest.mark.parametrize("which,change,message", [
    ("compact", _reversed_merges, "its model is not the one gpt2 writes"),
    ("compact", lambda o: o["model"]["vocab"].update({"xyzzy-not-gpt2": len(o["model"]["vocab"])}),
     "'xyzzy-not-gpt2' is not a GPT-2 token"),
    ("compact", lambda o: o.update(decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}),
     "decoder 'WordPiece': expected ByteLevel or Fuse"),
    ("compact", lambda o: o.update(pre_tokenizer=None), "its pre_tokenizer is not"),
    ("compact", lambda o: o.update(post_processor={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>",
        "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                             "tokens": ["<|endoftext|>"]}}}),
     "its post_processor adds tokens"),
    ("char", lambda o: o["model"]["vocab"].update({"ab": len(o["model"]["vocab"])}),
     "must hold characters"),
    ("char", _no_model, "expected a JSON object with a model"),
])  # fmt: skip
def test_foreign_hugging_face_tokenizers_are_refused(request, which, change, message) -> None:
    other = hf_json(request.getfixturevalue(which))
    change(other)
    with pytest.raises(ValueError, match=re.escape(message)):
        tokenizer_from_hf(other)
