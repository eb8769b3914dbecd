"""`make test-quick`'s guard (tests/support/quick.py): an unmarked test that starts a process or
compiles fails, naming the marker it lacks; a marked one runs as it is."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest
import torch
from support.quick import guarded, is_quick, mark_by_fixtures


@dataclass
class Item:
    """What the guard reads of a pytest item."""

    markers: set[str] = field(default_factory=set)
    fixturenames: tuple[str, ...] = ()
    nodeid: str = "tests/test_x.py::test_x"

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.markers.add(mark.name)


SPAWNS = {
    "subprocess.run": lambda: subprocess.run(["true"]),
    "subprocess.Popen": lambda: subprocess.Popen([sys.executable, "-c", "pass"]).wait(),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: os.fork(),
    "multiprocessing (spawn)": lambda: multiprocessing.get_context("spawn").Process(
        target=print).start(),
}


@pytest.mark.parametrize("how", SPAWNS)
def test_an_unmarked_test_that_starts_a_process_fails_naming_the_marker(how):
    with pytest.raises(pytest.fail.Exception, match=r"test_x starts a process .* "
                                                    r"@pytest.mark.process"):  # fmt: skip
        with guarded(Item()):
            SPAWNS[how]()


def test_a_process_started_by_another_thread_fails_it_too():
    def quietly() -> None:  # the refusal ends this thread, which no one joins to see it
        try:
            subprocess.run(["true"])
        except BaseException:  # noqa: BLE001
            pass

    with pytest.raises(pytest.fail.Exception, match="@pytest.mark.process"):
        with guarded(Item()):
            thread = threading.Thread(target=quietly)
            thread.start()
            thread.join()


def test_an_exception_handler_in_the_code_under_test_does_not_hide_it():
    def swallows() -> None:
        try:
            subprocess.run(["true"])
        except Exception:  # noqa: BLE001  (what the guard must get through)
            pass

    with pytest.raises(pytest.fail.Exception, match="@pytest.mark.process"):
        with guarded(Item()):
            swallows()


def test_an_unmarked_test_that_compiles_fails_naming_the_marker():
    with pytest.raises(pytest.fail.Exception, match="calls torch.compile .* @pytest.mark.compile"):
        with guarded(Item()):
            torch.compile(torch.nn.Linear(2, 2))


@pytest.mark.process
def test_a_marked_test_starts_its_processes_and_everything_is_restored():
    with guarded(Item({"process"})):
        assert subprocess.run(["true"]).returncode == 0
    with pytest.raises(pytest.fail.Exception):
        with guarded(Item()):
            subprocess.run(["true"])
    assert subprocess.run(["true"]).returncode == 0  # the guard's patches are gone again


def test_the_quick_tier_leaves_out_every_marker_and_the_clusters_fixtures():
    assert is_quick(Item())
    for marker in ("process", "compile", "apiserver", "slow", "minutes"):
        assert not is_quick(Item({marker}))
    for fixture in ("trainer_cluster", "pvc", "custom_api", "apiserver"):
        item = Item(fixturenames=("tmp_path", fixture))
        mark_by_fixtures(item)
        assert not is_quick(item), fixture
    item = Item(fixturenames=("tmp_path", "web_server"))
    mark_by_fixtures(item)
    assert is_quick(item)
