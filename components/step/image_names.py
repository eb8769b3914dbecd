"""Container image names, from their one source: `images.env` at the project root.

`IMAGE_REGISTRY` and `IMAGE_TAG` in the environment override the file, exactly as
`make ... IMAGE_REGISTRY=... IMAGE_TAG=...` does for the Makefile, so compiling the pipeline
under make points it at the same images the Makefile builds.
"""

from __future__ import annotations

import os
from pathlib import Path

IMAGES_ENV = Path(__file__).resolve().parents[2] / "images.env"


def _settings() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in IMAGES_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    for key in ("IMAGE_REGISTRY", "IMAGE_TAG"):
        values[key] = os.environ.get(key) or values[key]
    return values


def workload_image() -> str:
    """The image TrainJobs run: the `gpt` package and PyTorch."""
    s = _settings()
    return f"{s['IMAGE_REGISTRY']}/gpt-workload:{s['IMAGE_TAG']}"


def component_image() -> str:
    """The image KFP pipeline steps run: kfp, the kubernetes client, components/ and pipeline/."""
    s = _settings()
    return f"{s['IMAGE_REGISTRY']}/gpt-component:{s['IMAGE_TAG']}"
