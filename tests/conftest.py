"""Shared fixtures. Tests that need ../shared skip with a reason when it is absent."""

from __future__ import annotations

import signal
from itertools import zip_longest
from pathlib import Path

import pytest

# The test API server, started once for the whole session (tests/support/apiserver.py).
from support.apiserver import apiserver, custom_api, kserve_api, kubeconfig_env  # noqa: E402, F401

# The Trainer-faithful test cluster on that server (tests/support/cluster/).
from support.cluster import (  # noqa: E402, F401
    apiserver_without_kserve,
    forbidding_apiserver,
    kserve_cluster,
    kserve_cluster_without_images,
    kserve_server,
    pvc,
    run_images,
    trainer_cluster,
    trainer_feature_gates,
)

# images.env's names, whatever the environment says (tests/support/images_env.py).
from support.images_env import default_images  # noqa: E402, F401

# `make test-quick`'s tier and the guard that keeps it true (tests/support/quick.py).
from support.quick import guarded, is_quick, mark_by_fixtures

# Kubeflow's Model Registry: Prism holding requests to its OpenAPI spec, a store behind it
# (tests/support/registry.py).
from support.registry import model_registry  # noqa: E402, F401

# A local HTTP server of corpus texts (tests/support/web.py).
from support.web import web_server  # noqa: E402, F401

PROJECT = Path(__file__).resolve().parent.parent

# A shell's background job without job control (`(make test &)`) starts with SIGINT ignored, and
# every process inherits that: Python then keeps it ignored, so the tests of Ctrl-C (the prompt's
# terminal, a second signal stopping training) would find it dead. They test it as a terminal
# gives it; the xdist workers import this too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
SHARED = PROJECT.parent / "shared"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="only the tests that start no process, use no cluster and compile "
                          "nothing (make test-quick; tests/support/quick.py)")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --quick, only the quick tier (tests/support/quick.py). The longest tests first, so
    that, run in parallel (`make test`), they do not start last and leave one worker running
    alone at the end; and the tests that take minutes each paired
    with one other, since xdist's `--dist load --maxschedchunk 1` hands every worker two
    consecutive tests to begin with: each of them then starts at once on a worker of its own."""
    for item in items:
        mark_by_fixtures(item)
    if config.getoption("--quick"):
        config.hook.pytest_deselected(items=[item for item in items if not is_quick(item)])
        items[:] = [item for item in items if is_quick(item)]
    items.sort(key=lambda item: (item.get_closest_marker("minutes") is None,
                                 item.get_closest_marker("slow") is None))
    minutes = [item for item in items if item.get_closest_marker("minutes")]
    rest = items[len(minutes):]
    # (zip_longest: with fewer other tests than minutes ones, as when one is run alone, zip
    # would drop the unpaired ones, and pytest ran nothing)
    paired = [i for pair in zip_longest(minutes, rest[:len(minutes)]) for i in pair
              if i is not None]
    items[:] = paired + rest[len(minutes):]


# A quick test's fixtures and its body run guarded: a process started or a torch.compile called
# there fails it (tests/support/quick.py). Not its teardown, where a session fixture another
# test made may end its processes.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    with guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    with guarded(item):
        return (yield)


# Where the machine's user keeps their Hugging Face cache is theirs: a test that wants one sets
# it (gpt/fetch/model_source.py's cache_dir reads them); no test reads or fills the user's own.
HF_CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


@pytest.fixture(autouse=True)
def no_users_hub_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HF_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (the shared material lives beside the project in CI)")
    return SHARED


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh run root (what /gpt is on the cluster)."""
    r = tmp_path / "root"
    r.mkdir()
    return r
