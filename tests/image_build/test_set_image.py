"""Re-pointing the runtimes at other images (docker/set_image.py, what `make set-images` runs)."""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.images_env import DOCKER, set_image, workload_entry
from support.paths import PROJECT


def test_set_image_repoints_the_entry_and_keeps_everything_else() -> None:
    before = (PROJECT / "runtimes" / "kustomization.yaml").read_text()
    original = workload_entry()
    after = set_image(before, "gpt-workload", "registry.example.com:5000/me/gpt-workload:1.0")
    entry = next(e for e in yaml.safe_load(after)["images"] if e["name"] == original["name"])
    # newTag stays a string where YAML would read 1.0 as a number.
    assert entry["newName"] == "registry.example.com:5000/me/gpt-workload"
    assert entry["newTag"] == "1.0"
    changed = [a for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 2 and all("newName" in a or "newTag" in a for a in changed)
    # Setting it back restores the file byte for byte: comments and layout survive.
    ref = f"{original['newName']}:{original['newTag']}"
    assert set_image(after, "gpt-workload", ref) == before


@pytest.mark.process
def test_kustomize_rewrites_every_runtime_container(tmp_path: Path) -> None:
    # ClusterTrainingRuntime is a CRD: kustomize's images: must still reach its nested containers.
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its embedded kustomize) is not installed")
    runtimes = tmp_path / "runtimes"
    shutil.copytree(PROJECT / "runtimes", runtimes)
    kustomization = runtimes / "kustomization.yaml"
    ref = "registry.example.com:5000/me/gpt-workload:v9"
    kustomization.write_text(set_image(kustomization.read_text(), "gpt-workload", ref))
    rendered = subprocess.run([kubectl, "kustomize", str(runtimes)], capture_output=True,
                              text=True, check=True).stdout
    found = re.findall(r"^\s*image:\s*(\S+)", rendered, re.M)
    assert len(found) == 3 and set(found) == {ref}, found


@pytest.mark.parametrize(
    ("repo", "ref", "error"),
    [
        ("gpt-component", "r/gpt-component:v1", "no `images:` entry named 'gpt-component'"),
        ("gpt-workload", "registry.example.com:5000/me/gpt-workload", "has no tag"),
    ],
)
def test_set_image_refuses_what_it_cannot_do(repo: str, ref: str, error: str) -> None:
    text = (PROJECT / "runtimes" / "kustomization.yaml").read_text()
    with pytest.raises(ValueError, match=re.escape(error)):
        set_image(text, repo, ref)


@pytest.mark.process
def test_set_image_on_a_full_disk_leaves_the_kustomization_whole(tmp_path: Path) -> None:
    """A write cut short (here by a file-size limit, as a full volume would: EFBIG instead of
    ENOSPC) leaves the old file, not the first bytes of the new one, and no temporary."""
    kustomization = tmp_path / "kustomization.yaml"
    before = (PROJECT / "runtimes" / "kustomization.yaml").read_text()
    kustomization.write_text(before)
    limit = len(before.encode()) // 2

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run(
        [sys.executable, str(DOCKER / "set_image.py"), str(kustomization),
         "gpt-workload=registry.example.com/me/gpt-workload:v2"],
        capture_output=True, text=True, preexec_fn=small_files,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"set_image.py: error: {kustomization}: ")
    assert kustomization.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kustomization.yaml"]
