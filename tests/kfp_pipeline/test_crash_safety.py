"""The local pipeline survives SIGKILL anywhere, and two pipelines on one run never interleave.

Each trial kills `python -m pipeline run-local` (what `make demo` runs) with its whole process
group at a random moment; the same command run again goes on from there, and is killed in turn
in a later step, until a last run completes: it must end with the same data and bit-identical
weights as an uninterrupted run, and leave no temporary or half-written file under the root.
Every stage is hit in each test run, at a moment drawn anew over the whole of it, so that CI runs
between them hit it at whatever it does (tokenizing, writing a checkpoint, exporting, answering a
prompt); one kill a stage, in one chain of re-runs where the kills land in order (one pipeline's
work for the three, where a pipeline a kill cost a minute of CI).

A moment is a point of the uninterrupted run's step, taken from the last line that step printed
before it: a trial waits for that line, then for the rest of the moment. Timed from the step's
start instead, a kill landed in a later step, or after the end, whenever a trial ran faster than
the reference; each such trial cost another whole pipeline, and a few CI runs several minutes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from support.once import made_once
from support.paths import PROJECT
from support.runs import TINY_PIPELINE

from gpt.rundir.atomic import _LEFTOVER
from gpt.stages import STAGES

RUN = "crash"
# The tiny pipeline on the embedded corpus with the default tokenizer (gpt2: its training is one
# of the moments a kill lands in), seed and dropout; trained long enough to write several
# checkpoints and resume from one, with the context, evaluation and logging the stages' durations
# (over which the kills are spread) were measured with; one prompt.
SETTINGS = {
    **TINY_PIPELINE, "tokenizer": "gpt2", "block_size": 32, "max_iters": 60, "ckpt_interval": 10,
    "eval_interval": 20, "eval_iters": 4, "log_interval": 5, "prompt": ["To be, or not to be"],
}  # fmt: skip
KILLS_PER_STAGE = 1  # kills that land in each stage before the pipeline ends on its own
# A kill still lands in the next stage, or after the end, when the trial's step spends less time
# after its last line than the reference's did; such a trial still checks its run, and another
# one follows, up to this many in all.
MAX_TRIALS = 16


def command(root: Path) -> list[str]:
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    return [sys.executable, "-m", "pipeline", "run-local", "--root", str(root), "--run", RUN,
            *sets]


class Pipeline:
    """The pipeline as a process in a session of its own (so a kill takes the whole group, as
    Ctrl-C or a lost machine would), and when each of its steps began and ended."""

    def __init__(self, root: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **temp_dir(root)}
        self.proc = subprocess.Popen(command(root), cwd=PROJECT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.began: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        # when each line a step printed came, from the step's start
        self.printed: dict[str, list[float]] = {stage: [] for stage in STAGES}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            self.lines.append(line)
            # kfp.local logs "Executing task 'x'" and "Task 'x' finished with status ..."
            events = (self.began if "Executing task" in line
                      else self.ended if "finished with status" in line else None)
            for stage in STAGES:
                if events is not None and f"'{stage}'" in line:
                    events.setdefault(stage, now)
            stage = self.running()
            if events is None and stage is not None and stage not in self.ended:
                self.printed[stage].append(now - self.began[stage])

    def running(self) -> str | None:
        """The step under way now (the last one begun), or None before the first."""
        begun = [s for s in STAGES if s in self.began]
        return begun[-1] if begun else None

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def kill_at(self, stage: str, line: int, delay: float) -> bool:
        """Kill `delay` seconds after `stage` printed its `line`th line (0: its start), or at
        its end if it prints fewer; False if the pipeline ended first."""
        while self.proc.poll() is None and stage not in self.ended and (
                stage not in self.began or len(self.printed[stage]) < line):
            time.sleep(0.005)
        time.sleep(delay)
        if self.proc.poll() is not None:
            return False
        self.kill()
        return True

    def wait(self) -> int:
        code = self.proc.wait(timeout=600)
        self._reader.join(timeout=60)
        return code

    def output(self) -> str:
        return "".join(self.lines)


def temp_dir(root: Path) -> dict[str, str]:
    """A temporary directory of the trial's own, for its processes' environment."""
    tmp = root.parent / f"{root.name}-tmp"
    tmp.mkdir(exist_ok=True)
    return {"TMPDIR": str(tmp)}


def complete(root: Path) -> None:
    out = subprocess.run(command(root), cwd=PROJECT, capture_output=True, text=True,
                         timeout=600, env={**os.environ, **temp_dir(root)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def processes_under(root: Path) -> list[int]:
    """Live processes whose command line names `root`: a stage that outlived the kill."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(root) in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def losses(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "metrics" / "train.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in rows]


def assert_same_run(run: Path, reference: Path) -> None:
    for rel in ("corpus/text.txt", "corpus/source.json", "data/train.bin", "data/val.bin",
                "data/meta.json", "data/tokenizer.json", "model/model.safetensors",
                "model/config.json", "model/tokenizer.json", "ckpt/LATEST"):
        assert (run / rel).read_bytes() == (reference / rel).read_bytes(), rel
    final = (reference / "ckpt" / "LATEST").read_text().strip()
    weights = f"ckpt/{final}/model.safetensors"
    assert (run / weights).read_bytes() == (reference / weights).read_bytes(), weights
    assert losses(run) == losses(reference)
    replies = [json.loads(line)["reply"] for line in
               (run / "prompt" / "transcript.jsonl").read_text().splitlines()]
    reference_reply = json.loads((reference / "prompt" / "transcript.jsonl").read_text())["reply"]
    assert replies[-1] == reference_reply  # a killed attempt's replies stay in the transcript


def assert_nothing_half_written(root: Path) -> None:
    left = [p for p in root.rglob("*") if _LEFTOVER.match(p.name) or p.name.endswith(".lock")]
    assert not left, f"left behind: {left}"
    assert [p.name for p in (root / "kfp-outputs").iterdir()] == [RUN]
    assert not list((root / "kfp-outputs" / RUN).glob(".kfp-workspace*"))
    # kfp.local's workspace of a killed attempt is not left in the temporary directory
    assert not list(Path(temp_dir(root)["TMPDIR"]).glob("kfp-workspace-*"))


@dataclass
class Timings:
    """When each step of a pipeline began and ended, and when each line it printed came (from
    the step's start)."""

    began: dict[str, float]
    ended: dict[str, float]
    printed: dict[str, list[float]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Timings]:
    """An uninterrupted run, and its timings: made once for both tests, whichever worker runs
    them."""

    def run(folder: Path) -> None:
        pipeline = Pipeline(folder / "root")
        assert pipeline.wait() == 0, pipeline.output()[-3000:]
        assert set(pipeline.began) == set(pipeline.ended) == set(STAGES), pipeline.output()[-3000:]
        timings = Timings(pipeline.began, pipeline.ended, pipeline.printed)
        (folder / "timings.json").write_text(json.dumps(asdict(timings)))

    folder = made_once(tmp_path_factory, "crash-reference", run)
    timings = Timings(**json.loads((folder / "timings.json").read_text()))
    return folder / "root" / RUN, timings


def moment_in(reference: Timings, stage: str, at: float) -> tuple[int, float]:
    """The point `at` (0 to 1) of the reference's `stage`, as the number of lines the stage had
    printed by then and the seconds after the last of them."""
    second = at * (reference.ended[stage] - reference.began[stage])
    printed = [t for t in reference.printed[stage] if t <= second]
    return len(printed), second - (printed[-1] if printed else 0.0)


@pytest.mark.slow
@pytest.mark.minutes
@pytest.mark.timeout(1200)  # its trials are whole pipeline runs: 1-2 minutes beside other tests
def test_sigkill_at_random_moments_then_the_same_command_completes_identically(
    reference, tmp_path: Path
) -> None:
    ref_run, ref = reference
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    hit = dict.fromkeys(STAGES, 0)
    chain = Chain(tmp_path, 0)
    trial = -1
    while min(hit.values()) < KILLS_PER_STAGE:
        trial += 1
        assert trial < MAX_TRIALS, f"only {hit} kills landed in {trial} trials (seed {seed})"
        # The first step still to hit that this chain's run has not finished, at a random
        # point of it; a chain whose run is past every such step completes, and a new one starts.
        target = chain.next_target(hit)
        if target is None:
            chain.complete(ref_run)
            chain = Chain(tmp_path, chain.number + 1)
            target = chain.next_target(hit)
        at = rng.random()
        line, delay = moment_in(ref, target, at)
        pipeline = Pipeline(chain.root)
        if pipeline.kill_at(target, line, delay):
            stage = pipeline.running()
            assert stage is not None  # the target had begun
            hit[stage] += 1
        pipeline.wait()
        chain.finished |= set(pipeline.ended)
        # The kernel kills a stage the moment its parent dies; an orphan would live on for
        # seconds (the rest of its stage), so a short grace tells the two apart.
        deadline = time.monotonic() + 2
        while (orphans := processes_under(chain.root)) and time.monotonic() < deadline:
            time.sleep(0.1)
        chain.said.append(f"trial {trial}, killed {delay:.2f} s after line {line} of {target} "
                          f"({at:.0%} into it; seed {seed})")  # fmt: skip
        assert not orphans, f"{chain.said[-1]}: processes outlived the kill"
    chain.complete(ref_run)
    print(f"kills per stage: {hit} in {trial + 1} trials, {chain.number + 1} chain(s) "
          f"(seed {seed})")  # fmt: skip


class Chain:
    """One root killed again and again, each kill's re-run going on from where the one before
    left it (a step killed in one run and a later step in its re-run: three kills for the price
    of one pipeline), until the same command completes it."""

    def __init__(self, tmp_path: Path, number: int) -> None:
        self.number, self.root = number, tmp_path / f"chain-{number}"
        self.finished: set[str] = set()  # the steps a run of the chain finished
        self.said: list[str] = []  # each kill, for a failure's message

    def next_target(self, hit: dict[str, int]) -> str | None:
        later = [s for s in STAGES if hit[s] < KILLS_PER_STAGE and s not in self.finished]
        return later[0] if later else None

    def complete(self, ref_run: Path) -> None:
        complete(self.root)
        try:
            assert_same_run(self.root / RUN, ref_run)
            assert_nothing_half_written(self.root)
        except AssertionError as e:
            raise AssertionError(f"after {'; '.join(self.said)}: {e}") from None


@pytest.mark.slow
def test_two_pipelines_on_one_run_one_wins_the_other_names_the_busy_run(
    reference, tmp_path: Path
) -> None:
    ref_run, _ = reference
    root = tmp_path / "root"
    pipelines = [Pipeline(root), Pipeline(root)]
    codes = [p.wait() for p in pipelines]
    assert sorted(codes) == [0, 1], [p.output()[-2000:] for p in pipelines]
    loser = pipelines[codes.index(1)].output()
    error = loser.strip().splitlines()[-1]
    assert error.startswith("python -m pipeline run-local: error: --run 'crash' is busy: ")
    assert f"holds {root}/.{RUN}.lock" in error
    assert_same_run(root / RUN, ref_run)
    assert_nothing_half_written(root)
