"""Print requirements from pyproject.toml, one per line, for `pip install --requirement`.

The Dockerfiles install dependencies in a layer of their own (rebuilt only when pyproject.toml
changes, so PyTorch is not downloaded again on every code change) from this output:
pyproject.toml stays the only list of dependencies.

EXTRA `build-system` prints the build backend's requirements (what `pip install .` needs from a
wheelhouse when no index is asked).

usage: python requirements.py PYPROJECT [EXTRA]   (no EXTRA, or '': the core dependencies)
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str, extra: str | None = None) -> list[str]:
    with open(pyproject, "rb") as f:
        toml = tomllib.load(f)
    project = toml["project"]
    if extra == "build-system":
        return list(toml["build-system"]["requires"])
    if not extra:
        return list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise SystemExit(f"requirements.py: error: {pyproject} has no extra {extra!r}")
    return list(extras[extra])


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__.strip().splitlines()[-1])
    print("\n".join(requirements(*sys.argv[1:])))
