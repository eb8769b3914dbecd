"""Where --init_from's files come from (gpt/fetch/model_source.py): the Hub through a cache on
the run root's volume (read offline here, from a cache laid out as huggingface_hub lays one
out), each way the Hub can fail as one line, an s3:// prefix from moto's S3 server copied
whole once, a gs:// prefix through the same object-store code (fsspec's in-memory filesystem
standing in for gcsfs: no GCS server runs here), a local folder. Nothing reaches the network."""

from __future__ import annotations

import httpx2 as httpx  # what huggingface_hub 2 raises its HTTP errors with
import pytest
from huggingface_hub import errors
from support.gpt2 import hub_cache

from gpt.errors import InputError
from gpt.fetch import model_source, objectstore
from gpt.fetch.model_source import MODEL_FILES, cache_dir, fetch, parse

COMMIT = "c" * 40


def folder(path):
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights")
    return path


@pytest.mark.parametrize("text, canonical", [
    ("gpt2", "hf://openai-community/gpt2"),
    ("gpt2-xl", "hf://openai-community/gpt2-xl"),
    ("hf://EleutherAI/pythia-14m@v0", "hf://EleutherAI/pythia-14m@v0"),
    ("s3://bucket/runs/a/model", "s3://bucket/runs/a/model/"),
])  # fmt: skip
def test_names_parse_to_one_spelling(text, canonical):
    assert parse(text).canonical == canonical


@pytest.mark.parametrize("text", ["hf://gpt2", "hf://a/b@", "hf://a/b/c", "http://x/y", "gs://"])
def test_malformed_names_are_refused_in_one_line(text):
    with pytest.raises(ValueError, match="--init_from"):
        parse(text)


def test_the_hub_cache_on_the_volume_is_read_offline(tmp_path):
    hub_cache(cache_dir(tmp_path), "openai-community/gpt2", folder(tmp_path / "f"), COMMIT)
    got = fetch("gpt2", tmp_path, MODEL_FILES, say=lambda _: None, offline=True)
    assert got.revision == COMMIT and got.source == "hf://openai-community/gpt2"
    assert (got.path / "model.safetensors").read_bytes() == b"weights"
    assert got.path.is_relative_to(tmp_path / ".cache" / "huggingface" / "hub")


@pytest.mark.parametrize("variable, cache", [
    ("HF_HOME", "hf-home/hub"),
    ("HF_HUB_CACHE", "hub-cache"),
    ("HUGGINGFACE_HUB_CACHE", "hub-cache"),
])  # fmt: skip
def test_the_users_hub_cache_is_read_offline(tmp_path, monkeypatch, variable, cache):
    """GPT-2 where `huggingface-cli download` or any transformers script leaves it, under the
    user's HF_HOME (or HF_HUB_CACHE): found there with HF_HUB_OFFLINE=1, nothing written under
    the run root. huggingface_hub's own cache reader lists the same snapshot."""
    import huggingface_hub

    setting = tmp_path / cache.removesuffix("/hub")
    monkeypatch.setenv(variable, str(setting))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_cache(tmp_path / cache, "openai-community/gpt2", folder(tmp_path / "f"), COMMIT)
    seen = huggingface_hub.scan_cache_dir(tmp_path / cache)
    assert [(r.repo_id, [v.commit_hash for v in r.revisions]) for r in seen.repos] == [
        ("openai-community/gpt2", [COMMIT])]
    root = tmp_path / "root"
    said = []
    got = fetch("gpt2", root, MODEL_FILES, say=said.append)
    assert got.revision == COMMIT and got.path.is_relative_to(tmp_path / cache)
    assert (got.path / "model.safetensors").read_bytes() == b"weights"
    assert f"cache {tmp_path / cache}, offline" in said[0]
    assert not root.exists()


def test_hub_cache_takes_hf_hub_cache_before_hf_home_before_the_volume(tmp_path, monkeypatch):
    assert cache_dir(tmp_path) == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert cache_dir(tmp_path) == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert cache_dir(tmp_path) == tmp_path / "cache"


def test_hf_hub_offline_without_a_copy_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError) as e:
        fetch("hf://someone/nothing-here", tmp_path, MODEL_FILES, say=lambda _: None)
    assert str(e.value).startswith("--init_from 'hf://someone/nothing-here': HF_HUB_OFFLINE is "
                                   "set and the cache holds no copy")


def response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x"))


@pytest.mark.parametrize("raised, message", [
    (errors.RepositoryNotFoundError("404", response=response(404)), "no such repository"),
    (errors.GatedRepoError("403", response=response(403)), "gated on the Hub"),
    (errors.RevisionNotFoundError("404", response=response(404)), "has no revision 'v9'"),
    (errors.HfHubHTTPError("401", response=response(401)), "HTTP 401 from the Hub"),
    (errors.HfHubHTTPError("403", response=response(403)), "HTTP 403 from the Hub"),
    (errors.LocalEntryNotFoundError("connection refused"), "the Hub cannot be reached"),
])  # fmt: skip
def test_each_hub_failure_is_one_line(tmp_path, monkeypatch, raised, message):
    """The Hub's answers as huggingface_hub raises them (the call stood in for: no network)."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise raised

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(InputError, match=message) as e:
        fetch("hf://org/name@v9", tmp_path, MODEL_FILES, say=lambda _: None, offline=False)
    assert "\n" not in str(e.value) and str(e.value).startswith("--init_from 'hf://org/name@v9'")


def test_the_token_comes_from_hf_token(tmp_path, monkeypatch):
    import huggingface_hub

    seen = {}
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda *a, **kw: seen.update(kw) or str(folder(tmp_path / COMMIT)))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    fetch("gpt2", tmp_path, MODEL_FILES, say=lambda _: None, offline=False)
    assert seen["token"] == "hf_secret" and seen["cache_dir"] == cache_dir(tmp_path)
    assert "*.safetensors" in seen["allow_patterns"] and "*.bin" not in seen["allow_patterns"]


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        fetch(str(tmp_path / "nope"), tmp_path, MODEL_FILES)


@pytest.mark.process
def test_an_s3_prefix_is_copied_whole_once(tmp_path, monkeypatch):
    pytest.importorskip("moto", reason="the S3 test server is moto's (the dev extra)")
    from bench.s3server import AWS_VARIABLES, BUCKET, S3Server

    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with S3Server() as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        src = folder(tmp_path / "model")
        for f in src.iterdir():
            s3.client().upload_file(str(f), BUCKET, f"runs/a/model/{f.name}")
        uri = f"s3://{BUCKET}/runs/a/model"
        said = []
        got = fetch(uri, tmp_path / "root", MODEL_FILES, say=said.append)
        assert sorted(p.name for p in got.path.iterdir()) == ["config.json", "model.safetensors"]
        assert (got.path / "model.safetensors").read_bytes() == b"weights"
        again = fetch(uri, tmp_path / "root", MODEL_FILES, say=said.append)
        assert again.path == got.path and "cached in" in said[-1]
        with pytest.raises(InputError, match="not found \\(no such bucket, key or prefix\\)"):
            fetch(f"s3://{BUCKET}/nothing/", tmp_path / "root", MODEL_FILES, say=said.append)
    assert not list((tmp_path / "root" / ".cache" / "init_from").glob(".*staging"))
    assert model_source.parse(uri).kind == "store"


def test_a_gs_prefix_is_copied_by_the_object_stores_code(tmp_path, monkeypatch):
    """gs:// is gpt/fetch/objectstore.py's, as s3:// is; fsspec's in-memory filesystem stands in
    for gcsfs, as in tests/workload/fetch/test_objectstore.py."""
    from fsspec.implementations.memory import MemoryFileSystem

    memory = MemoryFileSystem(skip_instance_cache=True)
    memory.store.clear()
    monkeypatch.setattr(objectstore, "filesystem", lambda scheme, patience, fail: memory)
    src = folder(tmp_path / "model")
    for f in src.iterdir():
        memory.pipe_file(f"/bucket/runs/a/model/{f.name}", f.read_bytes())
    got = fetch("gs://bucket/runs/a/model", tmp_path / "root", MODEL_FILES)
    assert {p.name: p.read_bytes() for p in got.path.iterdir()} == {
        p.name: p.read_bytes() for p in src.iterdir()}
    assert got.path.parent == tmp_path / "root" / ".cache" / "init_from"
