"""A pretrained model's tokenizer recognised by how it tokenizes (gpt/tokenizer/recognition.py):
GPT-2's, whichever file layout holds it, is the shipped GPT-2 BPE; a tokenizer with GPT-2's
vocabulary that splits text otherwise is refused in one line. (The Hub's own GPT-2 files:
tests/workload/models/test_pretrained.py.)"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import pytest

from gpt.errors import InputError
from gpt.tokenizer.kinds import GPT2Tokenizer
from gpt.tokenizer.ranks import ENDOFTEXT, GPT2_PAT_STR, RANKS_ASSET
from gpt.tokenizer.recognition import pretrained_tokenizer


def tiktoken_converted(folder: Path, **pattern: str) -> Path:
    """`folder/tokenizer.json` as transformers' TikTokenConverter writes it from the shipped
    ranks: end-of-text an added token only, not in the model's vocab; `pattern` its own
    pre-tokenizer regex (TikTokenConverter's default is cl100k's, not GPT-2's)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    folder.mkdir()
    ranks = folder / "r50k_base.tiktoken"
    ranks.write_bytes(gzip.decompress(
        resources.files("gpt.assets").joinpath(RANKS_ASSET).read_bytes()))
    converted = TikTokenConverter(str(ranks), extra_special_tokens=[ENDOFTEXT], **pattern)
    converted.converted().save(str(folder / "tokenizer.json"))
    ranks.unlink()
    return folder


@pytest.mark.slow
def test_end_of_text_kept_only_among_the_added_tokens_is_still_gpt2s(tmp_path):
    folder = tiktoken_converted(tmp_path / "gpt2", pattern=GPT2_PAT_STR)
    saved = json.loads((folder / "tokenizer.json").read_text())
    assert ENDOFTEXT not in saved["model"]["vocab"]
    assert [(t["content"], t["id"]) for t in saved["added_tokens"]] == [(ENDOFTEXT, 50256)]
    tok = pretrained_tokenizer(folder)
    assert isinstance(tok, GPT2Tokenizer) and tok.kept is None


@pytest.mark.slow
def test_gpt2s_vocabulary_split_another_way_is_refused(tmp_path):
    """The same vocabulary and merges under cl100k's pattern (digits in threes, no leading
    space before punctuation...): it tokenizes otherwise, so it is not GPT-2's BPE."""
    folder = tiktoken_converted(tmp_path / "other")
    with pytest.raises(InputError) as e:
        pretrained_tokenizer(folder)
    assert str(e.value) == (f"{folder / 'tokenizer.json'}: not a tokenizer this project can use: "
                            "it has GPT-2's vocabulary but does not split text into GPT-2's ids")


@pytest.mark.slow
def test_a_vocabulary_without_end_of_text_anywhere_is_not_gpt2s(tmp_path):
    folder = tiktoken_converted(tmp_path / "no-eot", pattern=GPT2_PAT_STR)
    saved = json.loads((folder / "tokenizer.json").read_text())
    saved["added_tokens"] = []
    (folder / "tokenizer.json").write_text(json.dumps(saved))
    with pytest.raises(InputError, match="its 50,256-token vocabulary is not GPT-2's"):
        pretrained_tokenizer(folder)
