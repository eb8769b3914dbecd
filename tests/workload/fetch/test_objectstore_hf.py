"""Hugging Face datasets (`hf://datasets/ORG/NAME[@REVISION][/PATH]`) through huggingface_hub's
own HfFileSystem, against a local fake of the few Hub endpoints it calls (tests/support/
hubserver.py): a file, a folder, a glob (a split), a revision, a token, and each refusal.

The fake, not fsspec's memory filesystem: the memory filesystem would test only our fsspec
calls, where the fake also runs huggingface_hub's URL building, pagination, error mapping (a 401
becomes FileNotFoundError with the Hub's error as its cause) and streamed reads. It is not the
real Hub: nothing here was run against huggingface.co.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.corpora import read, refusal
from support.hubserver import HubServer

from gpt.config.configs import CorpusConfig
from gpt.data.sources import canonical, kind_of
from gpt.errors import InputError
from gpt.load_corpus import main as load_corpus


def shard(texts: list[str]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "score": [1.0] * len(texts)}), out)
    return out.getvalue()


def chat_shard(k: int) -> bytes:
    """A shard of a chat dataset as the Hub's hold them: a `messages` column of turns."""
    out = io.BytesIO()
    pq.write_table(pa.table({"messages": [
        [{"role": "user", "content": f"Question {k}.{i}?"},
         {"role": "assistant", "content": f"Answer {k}.{i}."}] for i in range(5)]}), out)
    return out.getvalue()


LINES = "".join(json.dumps({"text": f"sample line {i}. " * 20}) + "\n" for i in range(40))
FILES = {
    "README.md": b"---\nconfigs: ...\n---\n",
    ".gitattributes": b"*.parquet filter=lfs\n",
    "data/train-00000-of-00002.parquet": shard(["train one", "train two"]),
    "data/train-00001-of-00002.parquet": shard(["train three"]),
    "data/test-00000-of-00001.parquet": shard(["test one"]),
    "sample/10BT/000.jsonl": LINES.encode(),
}


@pytest.fixture(scope="module")
def hub():
    with HubServer() as server:
        server.add("org/fineweb", FILES)
        server.add("org/fineweb", {"old.jsonl": b'{"text": "at v1"}\n'}, revision="v1")
        server.add("org/private", {"x.jsonl": b'{"text": "secret"}\n'}, token="hf_right")
        server.add("org/chats", {f"data/train-0000{k}-of-00002.parquet": chat_shard(k)
                                 for k in range(2)})
        yield server


@pytest.fixture(autouse=True)
def endpoint(hub, monkeypatch):
    """The Hub at the fake's address (HF_ENDPOINT, which load-corpus hands HfFileSystem), no
    token; and no fetch of huggingface_hub's agent registry, which it asks of the Hub it was
    imported with (huggingface.co) while building its User-Agent."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:  # huggingface_hub 1.x has none
        from huggingface_hub.utils import _detect_agent
    except ImportError:
        return
    monkeypatch.setattr(_detect_agent, "_fetch_registry", lambda: None, raising=False)


def test_an_hf_uri_is_told_apart_by_spelling_alone():
    for uri in ("hf://datasets/org/name", "hf://datasets/org/name@v1/data/*.parquet"):
        assert kind_of(uri) == "hf" and canonical(uri) == uri
    for bad, says in (("hf://models/gpt2/x", "only dataset repositories"),
                      ("hf://datasets/org", "no repository")):  # fmt: skip
        with pytest.raises(InputError, match=says):
            kind_of(bad)


def test_a_glob_chooses_the_split(hub):
    text, docs = read("hf://datasets/org/fineweb/data/train-*.parquet")
    assert text == "train one\n\ntrain two\n\ntrain three"
    assert [d.origin for d in docs] == [
        "hf://datasets/org/fineweb/data/train-00000-of-00002.parquet",
        "hf://datasets/org/fineweb/data/train-00001-of-00002.parquet"]


def test_a_folder_is_its_corpus_files_in_name_order_and_a_file_is_itself(hub):
    text, docs = read("hf://datasets/org/fineweb/data")
    assert text == "test one\n\ntrain one\n\ntrain two\n\ntrain three"
    text, (doc,) = read("hf://datasets/org/fineweb/sample/10BT/000.jsonl")
    assert doc.documents == 40 and text.startswith("sample line 0. ")


def test_the_repository_root_takes_its_own_files_only(hub):
    with pytest.raises(InputError, match="no corpus files .* directly under this prefix"):
        read("hf://datasets/org/fineweb")  # README.md, .gitattributes: none is a corpus file


def test_a_revision_is_read_at_that_revision(hub):
    assert read("hf://datasets/org/fineweb@v1")[0] == "at v1"
    assert "revision not found" in refusal("hf://datasets/org/fineweb@v9")


def test_a_private_dataset_needs_the_token(hub, monkeypatch):
    message = refusal("hf://datasets/org/private")
    assert "the Hub answered 401 Unauthorized" in message and "set HF_TOKEN" in message
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert "401" in refusal("hf://datasets/org/private")
    monkeypatch.setenv("HF_TOKEN", "hf_right")
    assert read("hf://datasets/org/private")[0] == "secret"


def test_a_missing_repository_file_or_match_is_one_line(hub):
    assert "not found" in refusal("hf://datasets/org/nothing")
    assert "not found" in refusal("hf://datasets/org/fineweb/data/nothing.parquet")
    assert "no corpus files" in refusal("hf://datasets/org/fineweb/data/valid-*.parquet")


def test_a_chat_dataset_from_the_hub_is_conversations(hub, tmp_path):
    cfg = CorpusConfig(root=str(tmp_path), run="chat", source="hf://datasets/org/chats/data",
                       chat=True, block_size=32)  # fmt: skip
    load_corpus(cfg)
    record = json.loads(cfg.rundir.source_json.read_text())
    assert [d["documents"] for d in record["documents"]] == [5, 5]
    assert record["chat"] == {"conversations": 10, "cut": 0, "block_size": 32}
    text = cfg.rundir.text_txt.read_text()
    assert text.startswith("<|im_start|>user\nQuestion 0.0?<|im_end|>\n<|im_start|>assistant\n")
    assert cfg.rundir.train_mask.is_file() and cfg.rundir.val_mask.is_file()


def test_load_corpus_from_the_hub_records_its_files(hub, tmp_path):
    source = "hf://datasets/org/fineweb/sample/10BT/*.jsonl"
    cfg = CorpusConfig(root=str(tmp_path), run="hf", source=source, block_size=16)
    load_corpus(cfg)
    record = json.loads(cfg.rundir.source_json.read_text())
    assert record["kind"] == "hf" and record["source"] == source
    (doc,) = record["documents"]
    assert doc["origin"] == "hf://datasets/org/fineweb/sample/10BT/000.jsonl"
    assert doc["documents"] == 40 and doc["raw_bytes"] == len(LINES)
    assert not list(tmp_path.glob(".hf*")), "the download's scratch is gone"
