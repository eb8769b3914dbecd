"""A full volume anywhere: one line naming the path and what was being written, exit status 2,
and everything written before intact.

Each test runs its stage on a real, small tmpfs mounted as the run root (root only; skipped
otherwise) and fills it with a file of its own, leaving as many pages free as reach the writer
under test: tmpfs hands out space in pages, so the count is exact. Then the stage runs as the
CLI, in a process of its own, and must end with status 2 and that one line (no traceback), leave
the run's earlier files byte-identical (or, for an appended file, its earlier lines, and no line
cut short), and leave no temporary file behind; with the space freed the same command completes
(in the test's own process, where only its completing counts). Every stage takes the run lock
first, which writes a line into `<root>/.<run>.lock`: one page.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.models import RUN, export, one_shot
from support.runs import train, train_cli, write_data

from gpt.errors import EXIT_FATAL
from gpt.rundir.atomic import _LEFTOVER
from gpt.rundir.layout import RunDir
from gpt.tokenizer.kinds import CharTokenizer

PAGE = 4096
LOCK = 1  # the page of the run lock's holder line
# Checkpoints and metrics only where a test asks for them.
QUIET = ("--log_interval", "1000", "--eval_interval", "1000", "--keep_last", "5")


class Volume:
    """A tmpfs at `path`, and a filler file on it that leaves a given number of pages free."""

    def __init__(self, path: Path) -> None:
        self.path, self.filler = path, path / "filler"

    def fill(self, free_pages: int) -> None:
        self.free()
        stat = os.statvfs(self.path)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, (stat.f_bavail - free_pages) * stat.f_frsize)
        finally:
            os.close(fd)
        assert os.statvfs(self.path).f_bavail == free_pages

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Volume]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tmp_path / "volume"
    path.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
                           capture_output=True, text=True)
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield Volume(path)
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def files(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*"))
            if p.is_file()}


def pages(top: Path) -> int:
    """The pages the file `top`, or the files under the directory `top`, take on a tmpfs."""
    found = top.rglob("*") if top.is_dir() else [top]
    return sum(-(-p.stat().st_size // PAGE) for p in found if p.is_file())


def error(out: subprocess.CompletedProcess, prog: str) -> str:
    """What `<prog>: error: ...: free space or use a larger volume` says, the one line on stderr
    (but for generative-prompt's banner before it), from a stage that exited with status 2."""
    assert out.returncode == EXIT_FATAL, out.stderr
    *before, last = out.stderr.splitlines()
    assert before == [] or prog == "generative-prompt" and len(before) == 1, out.stderr
    head, tail = f"python -m gpt {prog}: error: ", ": free space or use a larger volume"
    assert last.startswith(head) and last.endswith(tail), out.stderr
    return last.removeprefix(head).removesuffix(tail)


def assert_no_temporaries(root: Path) -> None:
    left = [p for p in root.rglob("*") if _LEFTOVER.match(p.name) or p.name.endswith(".lock")]
    assert not left, f"left behind: {left}"


def assert_intact(top: Path, before: dict[str, bytes], appended: str = "") -> list[dict]:
    """The files under `top` are `before`, but for the file `appended`, which may have grown by
    whole JSON lines (returned), never by part of one."""
    after = files(top)
    old, new = before.get(appended, b""), after.get(appended, b"")
    assert new.startswith(old) and new.endswith(b"\n") or new == old == b""
    assert {k: v for k, v in after.items() if k != appended} == {
        k: v for k, v in before.items() if k != appended}
    return [json.loads(line) for line in new[len(old):].splitlines()]


def first_run(root: Path, *flags: str) -> RunDir:
    """A run trained to step 10 (checkpoint step-10, metrics, export, report) on the volume."""
    rundir = write_data(root, RUN)
    assert train(root, RUN, "--max_iters", "10", "--ckpt_interval", "10", *QUIET, *flags) == 0
    return rundir


@pytest.mark.process
@pytest.mark.parametrize("fits, shard", [("nothing", False), ("the weights", False),
                                         ("nothing", True)],
                         ids=["nothing", "the weights", "nothing, sharded"])
def test_checkpoint_leaves_the_previous_one_and_latest(volume: Volume, fits: str, shard: bool,
                                                      capsys) -> None:
    """A whole checkpoint, or a sharded one (--shard: DCP's writer, whose failure is a
    CheckpointException around the OSError)."""
    root = volume.path
    shard_flags = ("--shard", "true") if shard else ()
    rundir = first_run(root, *shard_flags)
    before = files(rundir.path)
    # The lock, the metrics line of step 20 (its evaluation), and either nothing of checkpoint
    # step-20 or its weights but not its optimizer state (torch.save's own writer loses the
    # errno of a full volume: it must write through Python to be told apart).
    weights = 0 if fits == "nothing" else pages(rundir.ckpt_step(10) / "model.safetensors")
    volume.fill(LOCK + 1 + weights)
    flags = ("--max_iters", "20", "--ckpt_interval", "10", *QUIET, *shard_flags)
    out = train_cli(root, RUN, *flags)
    where = rundir.ckpt_step(20) / "shards" if shard else rundir.ckpt_step(20)
    assert error(out, "train-gpt") == f"no space left on {where} (writing checkpoint step 20)"
    # step-10 and LATEST naming it, data, model, report: all as they were
    assert_intact(rundir.path, before, appended=str(RunDir.train_jsonl))
    assert_no_temporaries(root)

    volume.free()
    capsys.readouterr()
    assert train(root, RUN, *flags) == 0  # the same command, in this process
    assert "resumed from step-10" in capsys.readouterr().out
    assert rundir.latest.read_text() == "step-20\n"


@pytest.mark.process
def test_metrics_line_cut_short_is_cut_off(volume: Volume) -> None:
    root = volume.path
    rundir = first_run(root)
    before = files(rundir.path)
    volume.fill(LOCK)
    # A line every step: they fill the metrics file's last page, and the one that reaches past
    # it is written in part (tmpfs takes what fits in that page), then refused.
    flags = ("--max_iters", "100", "--log_interval", "1", "--ckpt_interval", "1000")
    out = train_cli(root, RUN, *flags)
    found = re.fullmatch(rf"no space left on {re.escape(str(rundir.train_jsonl))} "
                         r"\(writing the metrics of step (\d+)\)", error(out, "train-gpt"))
    assert found, out.stderr
    step = int(found[1])
    lines = assert_intact(rundir.path, before, appended=str(RunDir.train_jsonl))
    assert [r["step"] for r in lines] == list(range(11, step))
    assert_no_temporaries(root)

    volume.free()
    assert train(root, RUN, *flags) == 0  # the same command, in this process
    steps = [r["step"] for r in map(json.loads, rundir.train_jsonl.read_text().splitlines())]
    assert steps == sorted(set(steps)) and steps[-1] == 100  # the resumed run re-logged 11..


@pytest.mark.process
def test_export_leaves_the_previous_model(volume: Volume) -> None:
    root = volume.path
    rundir = first_run(root)
    before = files(rundir.path)
    volume.fill(LOCK)
    # The same command again: nothing left to train, so it re-exports, first thing it writes.
    flags = ("--max_iters", "10", "--ckpt_interval", "10", *QUIET)
    out = train_cli(root, RUN, *flags)
    assert error(out, "train-gpt") == (
        f"no space left on {rundir.model_dir} (writing the exported model)")
    assert_intact(rundir.path, before)
    assert_no_temporaries(root)

    volume.free()
    assert train(root, RUN, *flags) == 0  # the same command, in this process


@pytest.mark.process
def test_report_after_the_export(volume: Volume) -> None:
    root = volume.path
    # A model of fewer pages than the loss plot (of ten steps): the re-export fits exactly,
    # frees the old model's pages as it replaces it, and those are too few for the plot. (4 wide:
    # 5 pages against the plot's 6-7, whose size follows the curve it draws.)
    small = ("--n_embd", "4", "--log_interval", "1")
    rundir = first_run(root, *small)
    before = files(rundir.path)
    assert pages(rundir.model_dir) < pages(rundir.loss_png)
    volume.fill(LOCK + pages(rundir.model_dir))
    flags = ("--max_iters", "10", "--ckpt_interval", "10", *QUIET, *small)
    out = train_cli(root, RUN, *flags)
    assert error(out, "train-gpt") == f"no space left on {rundir.loss_png} (writing the loss plot)"
    assert_intact(rundir.path, before)  # the new model/ is the old one, byte for byte
    assert_no_temporaries(root)

    volume.free()
    assert train(root, RUN, *flags) == 0  # the same command, in this process


@pytest.mark.process
def test_transcript_line_cut_short_is_cut_off(volume: Volume) -> None:
    root = volume.path
    rundir = export(root, CharTokenizer.fit(["ANTIPHOLUS: To be, or not to be!\n"]))
    assert one_shot(rundir, "--prompt", "To be").returncode == 0
    before = files(rundir.path)
    volume.fill(LOCK)
    prompts = [a for _ in range(20) for a in ("--prompt", "ANTIPHOLUS: to be")]
    out = one_shot(rundir, "--max_new_tokens", "64", *prompts)
    assert error(out, "generative-prompt") == (
        f"no space left on {rundir.transcript_jsonl} (writing the transcript)")
    lines = assert_intact(rundir.path, before, appended=str(RunDir.transcript_jsonl))
    assert 0 < len(lines) < 20  # some fitted in the last page, then one did not
    assert_no_temporaries(root)

    volume.free()
    assert one_shot(rundir, "--max_new_tokens", "64", *prompts).returncode == 0


@pytest.mark.process
def test_corpus_leaves_the_previous_corpus_and_data(volume: Volume, tmp_path: Path) -> None:
    root = volume.path
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text("one two three four five six seven eight nine ten\n" * 100)
    large.write_text("eleven twelve thirteen fourteen fifteen sixteen\n" * 40_000)  # ~2 MB
    run = [sys.executable, "-m", "gpt", "load-corpus", "--root", str(root), "--run", RUN,
           "--tokenizer", "char", "--block_size", "8"]
    assert subprocess.run([*run, "--source", str(small)], capture_output=True).returncode == 0
    rundir = RunDir.of(root, RUN)
    before = files(rundir.path)
    # 4 MB: room for the cleaned text (2 MB), not for its token ids beside it (4 MB).
    again = [*run, "--source", str(large), "--overwrite", "true"]
    out = subprocess.run(again, capture_output=True, text=True)
    assert error(out, "load-corpus") == (
        f"no space left on {rundir.path} (writing the corpus (download, cleaned text, token ids))")
    assert_intact(rundir.path, before)
    assert_no_temporaries(root)

    subprocess.run(["mount", "-o", "remount,size=16m", str(root)], check=True)
    out = subprocess.run(again, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert rundir.text_txt.read_bytes() == large.read_bytes()


@pytest.mark.process
def test_a_download_is_not_retried_as_if_the_network_failed(
    volume: Volume, web_server: str
) -> None:
    volume.fill(LOCK)
    url = f"{web_server}/stream"
    out = subprocess.run([sys.executable, "-m", "gpt", "load-corpus", "--root", str(volume.path),
                          "--run", RUN, "--source", url], capture_output=True, text=True)
    scratch = re.escape(f"{volume.path}/.{RUN}.") + r"[a-z0-9_]{8}\.staging"
    assert re.fullmatch(rf"no space left on {scratch}/download \(writing the download of "
                        rf"{re.escape(url)}\)", error(out, "load-corpus")), out.stderr
    assert "attempt" not in out.stdout
    assert sorted(p.name for p in volume.path.iterdir()) == ["filler"]


@pytest.mark.process
def test_a_full_root_fails_at_the_run_lock(volume: Volume) -> None:
    volume.fill(0)
    out = one_shot(RunDir.of(volume.path, RUN), "--prompt", "x")
    assert error(out, "generative-prompt") == (
        f"no space left on {volume.path}/.{RUN}.lock (writing the run lock)")
    assert sorted(p.name for p in volume.path.iterdir()) == ["filler"]
