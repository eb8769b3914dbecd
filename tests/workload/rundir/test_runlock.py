"""One writer per run: the run lock, and the sweep of what killed writers left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt.__main__ import main as gpt_main
from gpt.rundir import atomic, runlock
from gpt.rundir.layout import RunDir

HOLD = """
import sys, time
from gpt.rundir import runlock
from gpt.rundir.layout import RunDir
with runlock.hold(RunDir.of(sys.argv[1], "r"), "a holder"):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(root: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.process
def test_a_held_run_refuses_a_second_writer_with_one_line(root: Path, capsys) -> None:
    holder = _holder(root)
    try:
        assert gpt_main(["load-corpus", "--root", str(root), "--run", "r"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "--run 'r' is busy: a holder (pid" in err and f"holds {root}/.r.lock" in err
        assert not (root / "r").exists()  # refused before it wrote anything
        # another run of the same root is free
        with runlock.hold(RunDir.of(root, "other"), "me"):
            pass
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.process
def test_a_killed_holder_leaves_no_stale_lock(root: Path) -> None:
    holder = _holder(root)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with runlock.hold(RunDir.of(root, "r"), "next"):
        assert "next (pid" in (root / ".r.lock").read_text()
    assert not (root / ".r.lock").exists()  # released: nothing left beside the run


@pytest.mark.process
def test_children_run_under_their_parents_lock_and_strangers_do_not(root: Path,
                                                                    monkeypatch) -> None:
    run = RunDir.of(root, "r")
    holder = _holder(root)
    try:
        monkeypatch.setenv(runlock.LOCK_ENV, str(runlock.lock_path(run).resolve()))
        with runlock.hold(run, "child"):  # started by the holder: runs under its lock
            pass
        monkeypatch.setenv(runlock.LOCK_ENV, str(root / ".other.lock"))
        with pytest.raises(runlock.RunBusy), runlock.hold(run, "stranger"):
            pass
        monkeypatch.delenv(runlock.LOCK_ENV)
        monkeypatch.setenv("RANK", "1")  # a torchrun rank other than 0 writes nothing
        with runlock.hold(run, "rank 1"):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_taking_the_lock_sweeps_what_killed_writers_left(root: Path) -> None:
    run = RunDir.of(root, "r")
    (run.data_dir).mkdir(parents=True)
    (run.data_dir / "meta.json").write_text("{}")
    leftovers = [
        run.data_dir / ".meta.json.ab_12xyz.tmp",  # atomic_path cut off before its rename
        run.path / ".corpus.k2j4h5g6.staging",  # staged_dir cut off while writing
        run.ckpt_dir / ".step-20.abcdefgh.staging",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".staging":
            path.mkdir()
            (path / "model.safetensors").write_bytes(b"half")
        else:
            path.write_text("half")
    # staged_dir cut off between its two renames: the old model/ is put back
    (run.path / ".model.old").mkdir()
    (run.path / ".model.old" / "config.json").write_text("old")
    # replaced already: the old copy just goes
    (run.path / "metrics").mkdir()
    (run.path / ".metrics.old").mkdir()
    with runlock.hold(run, "sweeper"):
        pass
    names = sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*"))
    assert names == ["ckpt", "data", "data/meta.json", "metrics", "model", "model/config.json"]
    assert (run.model_dir / "config.json").read_text() == "old"


def test_sweep_of_one_destination_leaves_its_neighbours(tmp_path: Path) -> None:
    for name in (".a.abcdefgh.staging", ".a.b.abcdefgh.staging", ".a.old"):
        (tmp_path / name).mkdir()
    atomic.sweep(tmp_path, "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.b.abcdefgh.staging", "a"]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


ORPHAN = """
import subprocess, sys, time
from gpt.distributed.orphans import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True, preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_in_its_own_session_dies_with_its_parent() -> None:
    # What the local backend does for a stage, and the CLI for a torchrun rank: a SIGKILLed
    # parent cannot stop its children, so each asks the kernel to kill it.
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")


def test_a_root_the_stage_cannot_write_is_one_line(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("not a directory")
    assert gpt_main(["load-corpus", "--root", str(afile), "--run", "r"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--root '{afile}': cannot create it" in err
    (tmp_path / ".r.lock").mkdir()  # something in the way of the lock file
    assert gpt_main(["load-corpus", "--root", str(tmp_path), "--run", "r"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create the run lock .r.lock: Is a directory" in err
