"""Atomic writes: all or nothing, and readable by the next stage."""

from __future__ import annotations

import os
import stat

import pytest

from gpt import atomic


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


def test_outputs_are_group_and_world_readable_under_default_umask(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        atomic.write_text(tmp_path / "f", "x", what="w")
        with atomic.staged_dir(tmp_path / "d", what="w") as stage:
            atomic.write_text(stage / "g", "y", what="w")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "g").st_mode) == 0o644


def test_append_jsonl_appends_whole_lines(tmp_path) -> None:
    dest = tmp_path / "t.jsonl"
    atomic.append_jsonl(dest, {"a": 1}, what="w")
    atomic.append_jsonl(dest, {"b": "é"}, what="w")
    assert dest.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "é"}\n'
