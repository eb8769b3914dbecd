"""Container images: one source of their names (images.env), the Dockerfiles, `make build-images`.

`make test` checks the Dockerfiles statically (parsed, and hadolint) and the Makefile with
`make -n` and fake engines; `make test-images` (tests/images/) builds the images and runs them.
Every image reference the project ships must agree with images.env: the runtimes and their
kustomization, the components' base_image, the compiled pipeline and the README.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml
from support.paths import PROJECT

from components.step import image_names as images

DOCKER = PROJECT / "docker"
WORKLOAD_DOCKERFILE = DOCKER / "workload.Dockerfile"
COMPONENT_DOCKERFILE = DOCKER / "component.Dockerfile"
BIN = Path(sys.executable).parent  # the venv's hadolint and yamllint
# An image reference to one of our two images, as it appears in any text.
IMAGE_REF = re.compile(r"[\w.\-/:${}]*/gpt-(?:workload|component):[\w.\-${}]+")



def docker_script(name: str):
    """A script of docker/ as a module, without putting docker/ on sys.path for every test."""
    spec = importlib.util.spec_from_file_location(f"docker_{name}", DOCKER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


requirements = docker_script("requirements").requirements
set_image = docker_script("set_image").set_image


def pyproject() -> dict:
    return tomllib.loads((PROJECT / "pyproject.toml").read_text())


@pytest.fixture
def default_images(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(workload, component) as images.env names them, whatever the environment says."""
    monkeypatch.delenv("IMAGE_REGISTRY", raising=False)
    monkeypatch.delenv("IMAGE_TAG", raising=False)
    return images.workload_image(), images.component_image()


# --- the Dockerfiles -----------------------------------------------------------------------------


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
    assert len(contexts) == 3, "expected the runtimes gpt-load-corpus/train-gpt/generative-prompt"
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


def test_hadolint_passes_on_the_dockerfiles() -> None:
    hadolint = BIN / "hadolint"
    bad = subprocess.run([str(hadolint), "-"], input="FROM python\n", text=True,
                         capture_output=True, cwd=PROJECT)
    assert bad.returncode != 0 and "DL3006" in bad.stdout  # it really lints
    result = subprocess.run([str(hadolint), str(WORKLOAD_DOCKERFILE), str(COMPONENT_DOCKERFILE)],
                            capture_output=True, text=True, cwd=PROJECT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_passes_on_the_manifests() -> None:
    result = subprocess.run([str(BIN / "yamllint"), "--strict", "runtimes", "manifests"],
                            capture_output=True, text=True, cwd=PROJECT)
    assert result.returncode == 0, result.stdout + result.stderr


# --- one source of the names ---------------------------------------------------------------------


def workload_entry() -> dict:
    """The runtimes' kustomization `images:` entry for the workload image."""
    kustomization = yaml.safe_load((PROJECT / "runtimes" / "kustomization.yaml").read_text())
    entries = [e for e in kustomization.get("images", [])
               if e["name"] == "gpt-workload" or e["name"].endswith("/gpt-workload")]
    assert len(entries) == 1, "runtimes/kustomization.yaml needs one images: entry for gpt-workload"
    return entries[0]


def test_runtimes_name_the_images_env_image_and_kustomize_repoints_them(default_images) -> None:
    workload, _ = default_images
    found = []
    for path in sorted((PROJECT / "runtimes").glob("gpt-*.yaml")):
        found += re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M)
    assert len(found) >= 3, "expected an image in each of the three runtimes"
    assert set(found) == {workload}, f"runtimes name {set(found)}, images.env says {workload}"
    # ... and kustomize rewrites that name to wherever `make set-images` points.
    assert workload_entry()["name"] == workload.rpartition(":")[0]


def test_kustomization_points_at_the_workload_image() -> None:
    # What `make set-images` writes: images.env, or the environment as make exports it.
    entry = workload_entry()
    assert f"{entry['newName']}:{entry['newTag']}" == images.workload_image(), (
        "runtimes/kustomization.yaml disagrees with images.env: run make set-images"
    )


def compiled_pipelines() -> list[Path]:
    paths = sorted((PROJECT / "pipeline").glob("*.yaml"))
    assert paths, "no compiled pipeline YAML in pipeline/ (make compile writes it)"
    return paths


def test_compiled_pipeline_uses_the_images_and_the_pinned_kfp() -> None:
    import kfp

    for path in compiled_pipelines():
        text = path.read_text()
        refs = set(IMAGE_REF.findall(text))
        assert images.component_image() in refs, f"{path.name} never runs the component image"
        assert refs <= {images.component_image(), images.workload_image()}, (
            f"{path.name} names {refs}; images.env (and the environment) say "
            f"{images.component_image()} and {images.workload_image()}: run make compile"
        )
        executors = [
            d for doc in yaml.safe_load_all(text) if doc and "deploymentSpec" in doc
            for d in doc["deploymentSpec"]["executors"].values()
        ]
        assert executors
        assert {e["container"]["image"] for e in executors} == {images.component_image()}
        assert re.search(rf"sdkVersion: kfp-{re.escape(kfp.__version__)}\b", text)


def test_components_base_image_follows_the_environment_at_compile_time() -> None:
    # The components read the names when imported, i.e. when the pipeline compiles: compiling
    # under `make ... IMAGE_REGISTRY=... IMAGE_TAG=...` re-points every step.
    probe = textwrap.dedent("""
        import importlib, pkgutil, components
        from kfp.dsl.base_component import BaseComponent
        for m in pkgutil.iter_modules(components.__path__):
            for name, obj in vars(importlib.import_module("components." + m.name)).items():
                if isinstance(obj, BaseComponent) and obj.component_spec.implementation.container:
                    print(name, obj.component_spec.implementation.container.image)
    """)
    env = {**os.environ, "IMAGE_REGISTRY": "registry.example.com/probe", "IMAGE_TAG": "t42"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=PROJECT, env=env, check=True).stdout.split("\n")
    found = dict(line.split() for line in out if line)
    assert len(found) >= 3, f"expected a component per stage in components/, found {found}"
    assert set(found.values()) == {"registry.example.com/probe/gpt-component:t42"}, found


def test_docs_name_exactly_the_images_env_images(default_images) -> None:
    """The README and docs/ (the cluster guide names the images) agree with images.env."""
    docs = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
    refs = {r for doc in docs for r in IMAGE_REF.findall(doc.read_text()) if "$" not in r}
    assert refs == set(default_images), f"the docs name {refs}; images.env says {default_images}"


# --- the Makefile --------------------------------------------------------------------------------


def fake_engine(tmp_path: Path, info_exit: int) -> tuple[dict, Path]:
    """A `fakedocker` on PATH that logs its calls; `info` exits with info_exit."""
    log = tmp_path / "calls.log"
    tool = tmp_path / "bin" / "fakedocker"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" != info ] || exit {info_exit}\n')
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{tool.parent}{os.pathsep}{os.environ['PATH']}"}, log


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], capture_output=True,
                          text=True, cwd=PROJECT, env=env)


@pytest.mark.parametrize("target", ["build-images", "push-images"])
def test_make_says_in_one_line_when_no_container_tool_is_installed(target: str) -> None:
    result = make(target, "CONTAINER_TOOL=/nonexistent/docker")
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "/nonexistent/docker not found" in result.stderr and "Podman" in result.stderr


@pytest.mark.parametrize("target", ["build-images", "push-images"])
def test_make_says_in_one_line_when_no_engine_runs(target: str, tmp_path: Path) -> None:
    env, log = fake_engine(tmp_path, info_exit=1)
    result = make(target, "CONTAINER_TOOL=fakedocker", env=env)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no engine answers" in result.stderr
    assert log.read_text().split("\n")[:-1] == ["info"], "it went on past the failed check"


def test_make_build_and_push_use_the_images_py_names_for_any_registry(tmp_path: Path) -> None:
    env, _ = fake_engine(tmp_path, info_exit=0)
    override = {"IMAGE_REGISTRY": "registry.example.com:5000/me", "IMAGE_TAG": "v7"}
    cli = [f"{k}={v}" for k, v in override.items()]
    env["PYTHONPATH"] = str(PROJECT)
    names = subprocess.run(
        [sys.executable, "-c", "from components.step.image_names import *; "
         "print(workload_image(), component_image())"],
        capture_output=True, text=True, check=True, env={**env, **override}, cwd=tmp_path,
    ).stdout.split()
    workload, component = names
    cuda = "https://download.pytorch.org/whl/cu128"
    build = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", f"TORCH_INDEX_URL={cuda}",
                 *cli, env=env)
    assert build.returncode == 0, build.stderr
    commands = build.stdout.replace("\\\n", " ")
    for dockerfile, image in (("workload", workload), ("component", component)):
        build_line = rf"fakedocker build --file docker/{dockerfile}.Dockerfile (.*)--tag (\S+) \."
        flags, tag = re.search(build_line, commands).groups()
        assert tag == image
        assert ("--build-arg TORCH_INDEX_URL=" + cuda in flags) == (dockerfile == "workload")
    # ... then re-points the runtimes and recompiles the pipeline, with the same names (exported).
    assert "make --no-print-directory set-images compile" in commands
    assert f"docker/set_image.py runtimes/kustomization.yaml gpt-workload={workload}" in commands
    push = make("-n", "push-images", "CONTAINER_TOOL=fakedocker", *cli, env=env)
    assert push.stdout.splitlines() == [f"fakedocker push {image}" for image in names]


def test_make_without_overrides_uses_images_env(tmp_path: Path, default_images) -> None:
    env, _ = fake_engine(tmp_path, info_exit=0)
    for var in ("IMAGE_REGISTRY", "IMAGE_TAG"):
        env.pop(var, None)
    push = make("-n", "push-images", "CONTAINER_TOOL=fakedocker", env=env)
    assert [line.split()[-1] for line in push.stdout.splitlines()] == list(default_images)


# --- re-pointing the runtimes (docker/set_image.py) ----------------------------------------------


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


def fake_tools(tmp_path: Path, **info_exits: int) -> dict:
    """Fake container tools on PATH, each logging its calls; `info` exits as given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, code in info_exits.items():
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\n[ "$1" != info ] || exit {code}\n')
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def build_lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """Dockerfile name -> the build command `make -n build-images` printed for it."""
    commands = " ".join(result.stdout.replace("\\\n", " ").split(" "))
    line = re.compile(r"\S+ build --file docker/(\w+)\.Dockerfile.*")
    return {m.group(1): " ".join(m.group(0).split()) for m in line.finditer(commands)}


def test_make_builds_with_the_first_tool_that_can_build_here(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=1, fakepodman=0, fakebuildah=0)
    build = make("-n", "build-images", "CONTAINER_TOOLS=fakedocker fakepodman fakebuildah", env=env)
    assert build.returncode == 0, build.stderr
    lines = build_lines(build)
    assert set(lines) == {"workload", "component"}
    assert all(line.startswith("fakepodman build ") for line in lines.values()), lines
    # Named, it wins over the first that answers.
    named = make("-n", "build-images", "CONTAINER_TOOLS=fakedocker fakepodman fakebuildah",
                 "CONTAINER_TOOL=fakebuildah", env=env)  # fmt: skip
    assert all(line.startswith("fakebuildah build ") for line in build_lines(named).values())


def test_make_says_in_one_line_when_no_tool_can_build_here(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=1, fakepodman=1)
    result = make("build-images", "CONTAINER_TOOLS=fakedocker fakepodman", env=env)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no container tool can build here" in result.stderr and "buildah" in result.stderr


def test_make_builds_from_a_wheelhouse_on_a_base_image_asking_no_index(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, fakedocker=0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    empty = make("build-images", "CONTAINER_TOOL=fakedocker", f"WHEELHOUSE={wheels}", env=env)
    assert empty.returncode != 0 and empty.stderr.strip().count("\n") == 0, empty.stderr
    assert f"WHEELHOUSE={wheels} has no wheels" in empty.stderr
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    mirror = "mirror.example.com/library/python:3.11.14-slim-bookworm"
    build = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", f"WHEELHOUSE={wheels}",
                 f"BASE_IMAGE={mirror}", env=env)  # fmt: skip
    for line in build_lines(build).values():
        assert f"--build-context wheelhouse={wheels} --build-arg PIP_NO_INDEX=true" in line, line
        assert f"--build-arg BASE_IMAGE={mirror}" in line
    plain = make("-n", "build-images", "CONTAINER_TOOL=fakedocker", env=env)
    for line in build_lines(plain).values():
        assert "wheelhouse" not in line and "PIP_NO_INDEX" not in line and "BASE_IMAGE" not in line


def test_make_wheelhouse_fills_the_folder_with_what_both_images_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    dry = make("-n", "wheelhouse", f"WHEELHOUSE={wheels}", "TORCH_INDEX_URL=")
    assert dry.returncode == 0, dry.stderr
    commands = " ".join(dry.stdout.replace("\\\n", " ").split())
    # The core dependencies, the extras the images install, and the build backend.
    installed = {m for d in DOCKER.glob("*.Dockerfile")
                 for m in re.findall(r"requirements\.py pyproject\.toml ?([\w-]*)", d.read_text())}
    listed = re.search(r"for extra in (.*?); do", commands)[1].split()
    assert {e.strip("'") for e in listed} == installed | {"build-system"}, listed
    assert f"-m pip wheel --wheel-dir {wheels} --requirement {wheels}/requirements.txt" in commands
    assert "--extra-index-url" not in commands  # TORCH_INDEX_URL empty: pip's own config
    toml = str(PROJECT / "pyproject.toml")
    assert requirements(toml, "build-system") == pyproject()["build-system"]["requires"]
    assert requirements(toml, "") == pyproject()["project"]["dependencies"]
    missing = make("wheelhouse")
    assert missing.returncode != 0 and "WHEELHOUSE=DIR" in missing.stderr
