"""A run's files are readable by another uid: the next stage, a notebook or a model server
(KServe's predictor, `transformers serve`) may run with its own securityContext on the volume."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.runs import train

from gpt.__main__ import main as gpt_main
from gpt.rundir.layout import RunDir

NOBODY = 65534  # not the uid that wrote the run


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A run root that another uid can reach (pytest's own temporary folders are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="gpt-shared-volume-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top)


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another uid needs root to switch to it")
def test_every_file_of_a_run_is_readable_by_another_uid(open_root: Path) -> None:
    old = os.umask(0o022)  # the container's default
    try:
        assert gpt_main(["load-corpus", "--root", str(open_root), "--run", "r",
                         "--tokenizer", "char", "--block_size", "16"]) == 0
        assert train(open_root, "r", "--max_iters", "4", "--ckpt_interval", "2") == 0
        assert gpt_main(["generative-prompt", "--root", str(open_root), "--run", "r",
                         "--prompt", "ANTIPHOLUS:", "--max_new_tokens", "4",
                         "--device", "cpu"]) == 0
    finally:
        os.umask(old)
    rundir = RunDir.of(open_root, "r")
    files = sorted(p for p in rundir.path.rglob("*") if p.is_file())
    names = {p.relative_to(rundir.path).as_posix() for p in files}
    assert {"model/model.safetensors", "data/train.bin", "metrics/train.jsonl",
            "prompt/transcript.jsonl"} <= names
    assert any(n.startswith("ckpt/step-") and n.endswith("/model.safetensors") for n in names)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    for d in [rundir.path, *(p for p in rundir.path.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d

    # cat, not Python: this machine's interpreter may sit where another uid cannot reach it.
    out = subprocess.run(["cat", *map(str, files)], user=NOBODY, group=NOBODY, extra_groups=[],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
