"""`make test-quick`: the tests that start no process, use no cluster and compile nothing, for the
edit loop; and the guard that keeps a test that does any of these out of it.

A test leaves the quick tier by a marker (pyproject.toml lists them): `process` (it starts a
process: subprocess, torchrun, multiprocessing), `compile` (torch.compile), `apiserver` (the test
API server, and with it the test cluster), `slow`, `minutes`. The cluster's fixtures add
`apiserver` themselves (`mark_by_fixtures`). For the rest the guard holds the markers true:
while an unmarked test is set up or runs, in `make test` as in `make test-quick`, starting a
process or calling torch.compile fails it, naming the marker it lacks. So a test that forgets
its marker fails in CI, instead of slowing down (or breaking) the quick tier.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

NOT_QUICK = ("process", "compile", "apiserver", "slow", "minutes", "serving")
"""The markers that keep a test out of the quick tier."""

# The fixtures of the test API server and the cluster on it (tests/support/apiserver.py,
# tests/support/cluster/): the server is a process of its own.
CLUSTER_FIXTURES = frozenset({"apiserver", "custom_api", "kserve_api", "kubeconfig_env",
                              "trainer_cluster", "pvc", "run_images", "kserve_cluster",
                              "kserve_cluster_without_images", "forbidding_apiserver",
                              "apiserver_without_kserve"})  # fmt: skip
# The fixtures of KServe's Hugging Face server (tests/support/cluster/): its virtualenv is
# `make test-serving`'s, whose tests are the ones marked `serving`.
SERVING_FIXTURES = frozenset({"kserve_server", "kserve_cluster"})

# Every way Python starts a process: subprocess (fork_exec, or posix_spawn where it may),
# multiprocessing (fork, or fork_exec for spawn and forkserver), os.system and its kin.
_SPAWNERS: tuple[tuple[object, str], ...] = (
    (subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork"),
    (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
)  # fmt: skip


def is_quick(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in NOT_QUICK)


def mark_by_fixtures(item: pytest.Item) -> None:
    """A test that uses the test API server, or the cluster on it, is marked `apiserver`; one
    that uses KServe's server, `serving` (and `process`: the server is one)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if CLUSTER_FIXTURES & fixtures:
        item.add_marker(pytest.mark.apiserver)
    if SERVING_FIXTURES & fixtures:
        item.add_marker(pytest.mark.serving)
        item.add_marker(pytest.mark.process)


class QuickTierViolation(BaseException):
    """A quick test started a process or compiled (a BaseException: no `except Exception` in the
    code under test may swallow it)."""


@contextlib.contextmanager
def guarded(item: pytest.Item) -> Iterator[None]:
    """While inside, a quick test that starts a process or calls torch.compile fails; any
    other test runs as it is."""
    if not is_quick(item):
        yield
        return
    caught: list[str] = []

    def refuse(what: str, marker: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            message = (f"{item.nodeid} {what} but is not marked "
                       f"@pytest.mark.{marker}: make test-quick would run it "
                       f"(tests/support/quick.py)")  # fmt: skip
            caught.append(message)
            raise QuickTierViolation(message)

        return refused

    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS
             if hasattr(owner, name)]  # fmt: skip
    for owner, name, _ in saved:
        setattr(owner, name, refuse(f"starts a process ({owner.__name__}.{name})", "process"))
    torch = sys.modules.get("torch")
    compile_ = torch.compile if torch is not None else None
    if torch is not None:
        torch.compile = refuse("calls torch.compile", "compile")
    try:
        yield
    except QuickTierViolation as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        if torch is not None:
            torch.compile = compile_
    if caught:  # raised where the test could not see it (another thread), or caught there
        pytest.fail(caught[0], pytrace=False)
