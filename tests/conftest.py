"""Shared fixtures. Tests that need ../shared skip with a reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

# The test API server, started once for the whole session (tests/apiserver.py).
from apiserver import apiserver, custom_api, kubeconfig_env  # noqa: E402, F401

# The Trainer-faithful test cluster on that server (tests/cluster/).
from cluster import pvc, run_images, trainer_cluster  # noqa: E402, F401

PROJECT = Path(__file__).resolve().parent.parent
SHARED = PROJECT.parent / "shared"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first: run in parallel (`make test`), the longest ones then do not start
    last and leave one worker running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
