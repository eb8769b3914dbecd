"""Atomic writes: all or nothing, and readable by the next stage."""

from __future__ import annotations

import os
import stat

import pytest
import safetensors.torch
import torch

from gpt.rundir import atomic


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path) -> None:
    dest = tmp_path / "meta.json"
    atomic.write_json(dest, {"v": 1}, what="w")
    with pytest.raises(RuntimeError), atomic.atomic_path(dest, what="w") as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert dest.read_text().strip().startswith("{") and '"v": 1' in dest.read_text()
    assert os.listdir(tmp_path) == ["meta.json"]


def test_staged_dir_replaces_only_when_complete(tmp_path) -> None:
    dest = tmp_path / "data"
    with atomic.staged_dir(dest, what="w") as stage:
        (stage / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic.staged_dir(dest, what="w") as stage:
        (stage / "a").write_text("new")
        raise RuntimeError("interrupted")
    assert (dest / "a").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["data"]
    with atomic.staged_dir(dest, what="w") as stage:
        (stage / "a").write_text("new")
    assert (dest / "a").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["data"]


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"),
                         [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775), (0o077, 0o600, 0o700)])
def test_outputs_take_the_mode_the_umask_gives(tmp_path, umask, file_mode, dir_mode) -> None:
    """Whatever mode a writer gives its own file (safetensors makes its own private temporary file
    and renames it over ours), what lands has the mode open() and mkdir() give under the umask."""
    old = os.umask(umask)
    try:
        atomic.write_text(tmp_path / "f", "x", what="w")
        with atomic.atomic_path(tmp_path / "w.safetensors", what="w") as tmp:
            safetensors.torch.save_file({"w": torch.zeros(2)}, str(tmp))
        with atomic.staged_dir(tmp_path / "d", what="w") as stage:
            atomic.write_text(stage / "g", "y", what="w")
            safetensors.torch.save_file({"w": torch.zeros(2)}, str(stage / "model.safetensors"))
            (stage / "sub").mkdir(mode=0o700)
            private = stage / "sub" / "private"
            private.write_text("z")
            private.chmod(0o600)
        atomic.append_jsonl(tmp_path / "t.jsonl", {"a": 1}, what="w")
    finally:
        os.umask(old)
    for f in ("f", "w.safetensors", "d/g", "d/model.safetensors", "d/sub/private", "t.jsonl"):
        assert _mode(tmp_path / f) == file_mode, f
    assert _mode(tmp_path / "d") == dir_mode
    assert _mode(tmp_path / "d" / "sub") == dir_mode


def test_append_jsonl_appends_whole_lines(tmp_path) -> None:
    dest = tmp_path / "t.jsonl"
    atomic.append_jsonl(dest, {"a": 1}, what="w")
    atomic.append_jsonl(dest, {"b": "é"}, what="w")
    assert dest.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "é"}\n'
