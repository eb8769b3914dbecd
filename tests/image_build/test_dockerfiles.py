"""The Dockerfiles (docker/*.Dockerfile) and what they send and install, checked statically: parsed,
and hadolint; `make test-images` (tests/images/) builds the images and runs them."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from support.images_env import COMPONENT_DOCKERFILE, WORKLOAD_DOCKERFILE, pyproject, requirements
from support.paths import PROJECT

from gpt.stages import STAGES

BIN = Path(sys.executable).parent  # the venv's hadolint


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    return [(ins.upper(), rest.strip()) for ins, _, rest in (s.partition(" ") for s in logical)]


def run_commands(run: str) -> list[list[str]]:
    """The commands of one RUN (split at &&, its --mount flags dropped), as argument lists."""
    return [shlex.split(command) for command in re.sub(r"^(--mount=\S+\s+)+", "", run).split("&&")]


def shell_commands(dockerfile: Path) -> list[list[str]]:
    """Every command of every RUN, as argument lists."""
    return [c for ins, rest in instructions(dockerfile) if ins == "RUN" for c in run_commands(rest)]


def pip_installs_in(run: str) -> list[list[str]]:
    return [c[2:] for c in run_commands(run) if c[:2] == ["pip", "install"]]


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments after `pip install` of every pip install in the Dockerfile."""
    return [c[2:] for c in shell_commands(dockerfile) if c[:2] == ["pip", "install"]]


def positional(args: list[str]) -> list[str]:
    """What pip installs: the arguments that are neither options nor option values."""
    takes_value = {"--extra-index-url", "--index-url", "--find-links", "--requirement", "-r"}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in takes_value:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


@pytest.mark.parametrize("dockerfile", [WORKLOAD_DOCKERFILE, COMPONENT_DOCKERFILE], ids=str)
def test_dockerfiles_install_only_what_pyproject_lists(dockerfile: Path) -> None:
    # The dependencies come from pyproject.toml (through docker/requirements.py), then the project
    # itself with `pip install .`: no package is named in a Dockerfile, so no second list drifts.
    installs = pip_installs(dockerfile)
    assert installs, f"{dockerfile.name} installs nothing with pip"
    for args in installs:
        assert positional(args) in ([], ["."]), f"{dockerfile.name} names packages: {args}"
        if "--requirement" in args:
            assert args[args.index("--requirement") + 1] == "requirements.txt"
    assert any(positional(args) == ["."] for args in installs)
    generated = [c for c in shell_commands(dockerfile) if "requirements.py" in c]
    assert generated and all(c[2] == "pyproject.toml" for c in generated)


def test_workload_image_installs_the_project_with_its_dependencies() -> None:
    commands = shell_commands(WORKLOAD_DOCKERFILE)
    # The core dependencies (PyTorch among them), not an extra; then `.` without --no-deps,
    # and `pip check` proves the environment complete.
    assert ["python", "requirements.py", "pyproject.toml", ">"] in [c[:4] for c in commands]
    project = [a for a in pip_installs(WORKLOAD_DOCKERFILE) if positional(a) == ["."]]
    assert project and all("--no-deps" not in a for a in project)
    assert ["pip", "check"] in commands
    assert "torch" in " ".join(requirements(str(PROJECT / "pyproject.toml")))


def test_workload_image_has_the_storage_extra_for_s3_and_gs_uris() -> None:
    # load-corpus's s3:// and gs:// sources and train-gpt's --export_uri run in this image.
    commands = shell_commands(WORKLOAD_DOCKERFILE)
    assert ["python", "requirements.py", "pyproject.toml", "storage", ">>"] in [
        c[:5] for c in commands]  # fmt: skip
    storage = " ".join(requirements(str(PROJECT / "pyproject.toml"), "storage"))
    assert "s3fs" in storage and "gcsfs" in storage


def test_workload_image_is_cpu_by_default_and_cuda_by_build_arg() -> None:
    build_args = dict(
        rest.split("=", 1) for ins, rest in instructions(WORKLOAD_DOCKERFILE) if ins == "ARG"
    )
    assert build_args.get("TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    for args in pip_installs(WORKLOAD_DOCKERFILE):
        assert args[args.index("--extra-index-url") + 1] == "${TORCH_INDEX_URL}"


def runtime_security_contexts() -> list[dict]:
    contexts = []
    for path in sorted((PROJECT / "runtimes").glob("gpt-*.yaml")):
        runtime = yaml.safe_load(path.read_text())
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            contexts.append(job["template"]["spec"]["template"]["spec"]["securityContext"])
    return contexts


def test_workload_image_user_matches_the_runtimes() -> None:
    contexts = runtime_security_contexts()
    assert len(contexts) == len(STAGES), "expected one runtime per stage"
    ids = {(c["runAsUser"], c["runAsGroup"], c["fsGroup"]) for c in contexts}
    assert len(ids) == 1, f"the runtimes disagree on their user: {ids}"
    uid, gid, fs_group = ids.pop()
    steps = instructions(WORKLOAD_DOCKERFILE)
    users = [rest for ins, rest in steps if ins == "USER"]
    # Numeric, so the kubelet can verify runAsNonRoot without the image's /etc/passwd.
    assert users[-1] == f"{uid}:{gid}" and uid != 0
    run = " ".join(rest for ins, rest in steps if ins == "RUN")
    assert f"--uid {uid}" in run and f"--gid {gid}" in run and gid == fs_group


def test_workload_image_smoke_tests_the_cli_as_its_user() -> None:
    steps = instructions(WORKLOAD_DOCKERFILE)
    last_user = max(i for i, (ins, _) in enumerate(steps) if ins == "USER")
    smoke = [i for i, step in enumerate(steps) if step == ("RUN", "python -m gpt --help")]
    assert smoke and smoke[-1] > last_user
    assert steps[-1] == ("CMD", '["python", "-m", "gpt", "--help"]')
    # The BPE ranks the gpt2 tokenizer reads ship as package data: nothing to download at run time.
    assert "assets/*" in pyproject()["tool"]["setuptools"]["package-data"]["gpt"]
    assert (PROJECT / "gpt" / "assets" / "r50k_base.tiktoken.gz").is_file()


def test_component_image_pins_the_kfp_that_compiles_the_pipeline() -> None:
    import kfp

    commands = shell_commands(COMPONENT_DOCKERFILE)
    assert ["python", "requirements.py", "pyproject.toml", "pipeline", ">"] in [
        c[:5] for c in commands
    ]
    reqs = requirements(str(PROJECT / "pyproject.toml"), "pipeline")
    pins = [r for r in reqs if re.match(r"kfp(\[|=)", r)]
    assert len(pins) == 1 and pins[0].endswith(f"=={kfp.__version__}"), (pins, kfp.__version__)
    # Slim: no PyTorch, neither from the extra nor from the project's own core dependencies.
    assert not any(r.startswith("torch") for r in reqs)
    project = [a for a in pip_installs(COMPONENT_DOCKERFILE) if positional(a) == ["."]]
    assert project and all("--no-deps" in a for a in project)


def test_component_image_carries_images_env_for_its_imports() -> None:
    # Importing a component calls component_image(), which reads images.env: the image carries
    # it where images.py looks, before the smoke test imports anything. (The workload image a
    # step launches comes from the compiled pipeline, not from this file.)
    steps = instructions(COMPONENT_DOCKERFILE)
    assert any(ins == "COPY" and "images.env" in rest.split()[:-1] for ins, rest in steps)
    commands = [" ".join(c) for c in shell_commands(COMPONENT_DOCKERFILE)]
    placed = next(i for i, c in enumerate(commands) if c.startswith("cp images.env")
                  and "components.step.image_names import IMAGES_ENV" in c)
    smoke = next(i for i, c in enumerate(commands) if "importlib.import_module" in c)
    assert placed < smoke


@pytest.mark.process
def test_components_and_pipeline_import_without_the_workload_dependencies() -> None:
    # The component image has none of the core dependencies (PyTorch, numpy, ...): every module
    # of components/ and pipeline/ must import without them, as the image's smoke test does.
    core = [re.split(r"[\[<>=!~; ]", r)[0] for r in requirements(str(PROJECT / "pyproject.toml"))]
    probe = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        for name in {core!r}:
            sys.modules[name] = None  # `import name` now raises ImportError
        import components, pipeline
        for package in (components, pipeline):
            for m in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{{package.__name__}}.{{m.name}}")
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("dockerfile", [WORKLOAD_DOCKERFILE, COMPONENT_DOCKERFILE], ids=str)
def test_base_image_is_pinned_and_replaceable(dockerfile: Path) -> None:
    # The image starts from BASE_IMAGE, by default the pinned official Python image; the only
    # other stage is the empty wheelhouse a WHEELHOUSE build replaces with its folder.
    steps = instructions(dockerfile)
    assert [rest for ins, rest in steps if ins == "FROM"] == ["scratch AS wheelhouse",
                                                              "${BASE_IMAGE}"]  # fmt: skip
    default = dict(rest.split("=", 1) for ins, rest in steps if ins == "ARG" and "=" in rest)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", default["BASE_IMAGE"]), default
    assert steps.index(("ARG", "BASE_IMAGE=" + default["BASE_IMAGE"])) == 0  # before any FROM


@pytest.mark.parametrize("dockerfile", [WORKLOAD_DOCKERFILE, COMPONENT_DOCKERFILE], ids=str)
def test_every_pip_install_sees_the_wheelhouse(dockerfile: Path) -> None:
    # WHEELHOUSE builds: PIP_NO_INDEX=true and the wheels at /wheelhouse, for every install.
    runs = [r for ins, r in instructions(dockerfile) if ins == "RUN" and "pip install" in r]
    assert runs
    for run in runs:
        assert run.startswith("--mount=type=bind,from=wheelhouse,target=/wheelhouse "), run
        for args in pip_installs_in(run):
            assert args[:2] == ["--find-links", "/wheelhouse"], args
    assert ("ARG", "PIP_NO_INDEX=false") in instructions(dockerfile)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_dockerignore_sends_what_the_dockerfiles_copy_and_nothing_local() -> None:
    lines = (PROJECT / ".dockerignore").read_text().splitlines()
    patterns = [s.strip() for s in lines if s.strip() and not s.startswith("#")]
    copied = [
        src
        for dockerfile in (WORKLOAD_DOCKERFILE, COMPONENT_DOCKERFILE)
        for ins, rest in instructions(dockerfile)
        if ins == "COPY"
        for src in rest.split()[:-1]
    ]
    assert copied
    for src in copied:
        assert (PROJECT / src).exists(), f"COPY {src}: no such path"
        assert not dockerignored(src.rstrip("/") + "/__init__.py" if src.endswith("/") else src,
                                 patterns), f".dockerignore drops {src}, which a Dockerfile copies"
    for local in (".venv/bin/python", "runs/demo/LATEST", ".git/HEAD", "gpt/__pycache__/a.pyc"):
        assert dockerignored(local, patterns), f".dockerignore lets {local} into the build context"


@pytest.mark.process
def test_hadolint_passes_on_the_dockerfiles() -> None:
    hadolint = BIN / "hadolint"
    bad = subprocess.run([str(hadolint), "-"], input="FROM python\n", text=True,
                         capture_output=True, cwd=PROJECT)
    assert bad.returncode != 0 and "DL3006" in bad.stdout  # it really lints
    result = subprocess.run([str(hadolint), str(WORKLOAD_DOCKERFILE), str(COMPONENT_DOCKERFILE)],
                            capture_output=True, text=True, cwd=PROJECT)
    assert result.returncode == 0, result.stdout + result.stderr
