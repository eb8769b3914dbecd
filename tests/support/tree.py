"""A copy of the project to make edits in, and what those edits changed: the tests that hold an
"adding X is N edits" claim (tests/kfp_components/step/test_parameter_docs.py,
tests/workload/test_stages.py) make the edits there."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from support.paths import PROJECT

_SKIP = ("__pycache__", "*.tiktoken")  # byte code, and the tokenizer files tests never read


def copy_project(dest: Path, parts: tuple[str, ...]) -> Path:
    """`parts` of the project (folders or files at its top) copied to `dest`, which is returned."""
    for part in parts:
        if (PROJECT / part).is_dir():
            shutil.copytree(PROJECT / part, dest / part, ignore=shutil.ignore_patterns(*_SKIP))
        else:
            shutil.copy(PROJECT / part, dest / part)
    return dest


def changed_files(copy: Path, parts: tuple[str, ...]) -> list[str]:
    """The files under `parts` that the copy adds or changes, by their path in the project."""
    changed = []
    for part in parts:
        for path in sorted((copy / part).rglob("*") if (copy / part).is_dir() else [copy / part]):
            rel = path.relative_to(copy)
            if path.is_dir() or "__pycache__" in rel.parts:
                continue
            original = PROJECT / rel
            if not original.exists() or not filecmp.cmp(path, original, shallow=False):
                changed.append(str(rel))
    return changed
