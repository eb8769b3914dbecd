"""The import graph keeps docs/architecture.md's one-way rule: no cycle, nothing imports upward;
and tests share code only through tests/support/, each module under one name.

The graph is read from the source with `ast` (every import, at the top of a module or inside a
function), so a lazy import that closes a circle fails here as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.layers import GPT_LAYERS
from support.paths import PROJECT

from gpt.stages import STAGES

TESTS = PROJECT / "tests"
PACKAGES = ("gpt", "components", "pipeline")
# A package may import only those after it: pipeline/ -> components/ -> gpt/.
ORDER = {"pipeline": 0, "components": 1, "gpt": 2}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((PROJECT / package).rglob("*.py")):
            parts = path.relative_to(PROJECT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path) -> list[tuple[int, list[str]]]:
    """Each import statement of `path` (line, the names it may load): `from gpt.rundir import
    atomic` may load gpt.rundir and gpt.rundir.atomic."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.append((node.lineno, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno,
                          [node.module, *(f"{node.module}.{a.name}" for a in node.names)]))
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (`from gpt.rundir import atomic` counts as
    gpt.rundir.atomic)."""
    return {n for _, names in imports(path) for n in names if n in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) - {name} for name, path in mods.items()}


def test_the_graph_is_read():
    g = graph()
    assert {"gpt.train_gpt", "gpt.training.report", "components.trainjob.launcher",
            "pipeline.pipeline"} <= set(g)
    assert "gpt.stages" in g["gpt.__main__"] and "gpt.rundir.atomic" in g["gpt.training.report"]
    # an import inside a function counts
    assert "components.step.local_process" in g["components.step.dispatch"]


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)


def test_no_import_runs_back_up():
    for name, deps in graph().items():
        for dep in deps:
            upward = ORDER[dep.split(".")[0]] < ORDER[name.split(".")[0]]
            assert not upward, f"{name} imports {dep}: {name.split('.')[0]}/ must not import upward"
            assert not dep.endswith("__main__"), f"{name} imports the entry module {dep}"


def gpt_layer(module: str) -> int:
    room = module.split(".")[1] if "." in module else "__init__"
    if room == "__init__" or room == "assets":
        return len(GPT_LAYERS)  # gpt/__init__.py holds a docstring alone
    found = [i for i, layer in enumerate(GPT_LAYERS) if room in layer]
    assert found, f"gpt.{room} is in no layer of GPT_LAYERS: place it there and in the docs' map"
    return found[0]


def test_gpt_rooms_import_downwards_only():
    for name, deps in graph().items():
        if not name.startswith("gpt.") or name == "gpt.__init__":
            continue
        for dep in (d for d in deps if d.startswith("gpt.")):
            here, there = gpt_layer(name), gpt_layer(dep)
            same_room = name.split(".")[1] == dep.split(".")[1]
            assert same_room or there > here, (
                f"{name} imports {dep}: gpt.{dep.split('.')[1]} is not below "
                f"gpt.{name.split('.')[1]} (GPT_LAYERS)")


def test_the_configs_and_the_model_stay_off_the_stages_work():
    """The configs import nothing of a stage's work (the component image reads them, and a
    config must not load the corpus path or PyTorch); the model imports nothing of the corpus
    path, nor the corpus path anything of training: GPT_LAYERS says so, and this holds it
    whatever GPT_LAYERS becomes."""
    g = graph()
    rooms = {name: {dep.split(".")[1] for dep in deps if dep.startswith("gpt.")}
             for name, deps in g.items() if name.startswith("gpt.")}
    for name, deps in rooms.items():
        room = name.split(".")[1]
        if room == "config":
            assert not deps & {"data", "models", "training", "generation"}, (name, deps)
        if room == "models":
            assert "data" not in deps, (name, deps)
        if room == "data":
            assert not deps & {"models", "training", "generation"}, (name, deps)


def test_every_room_is_a_package_the_images_install():
    """pyproject's `packages.find` (not find_namespace) installs a folder only with its
    __init__.py: without one, a room imports here (the checkout is on sys.path) and is missing
    from the images' non-editable install."""
    for package in PACKAGES:
        for folder in (PROJECT / package).rglob("*"):
            if folder.is_dir() and any(folder.glob("*.py")):
                assert (folder / "__init__.py").is_file(), f"{folder}: no __init__.py"


def test_each_stage_is_one_row_with_its_names_derived():
    for name, stage in STAGES.items():
        assert stage.name == name
        assert (PROJECT / "runtimes" / f"{stage.runtime}.yaml").is_file()
        assert (PROJECT / (stage.component_module.replace(".", "/") + ".py")).is_file()
        assert (PROJECT / (stage.module.replace(".", "/") + ".py")).is_file()


def outside_support(folder: Path) -> set[str]:
    """What a module under `folder` could import by a bare name other than `support`: every test
    module, conftest and folder there (pytest puts tests/ and each test module's folder on
    sys.path, so each is importable by its own name)."""
    return {path.stem if path.suffix == ".py" else path.name
            for path in folder.rglob("*")
            if (path.suffix == ".py" or path.is_dir()) and "__pycache__" not in path.parts
            and path.relative_to(folder).parts[0] != "support"}


def shared_between_tests(folder: Path) -> list[str]:
    """Each import under `folder` of anything in it but support/: a test module (`test_*`), a
    conftest, a module or folder beside them, or one through the `tests.` package (tests/ is on
    sys.path, so that would load it a second time, under a second name)."""
    local = outside_support(folder) | {"tests", "conftest"}
    found = []
    for path in sorted(folder.rglob("*.py")):
        for line, names in imports(path):
            if any(name.split(".")[0] in local
                   or any(part.startswith("test_") for part in name.split(".")) for name in names):
                found.append(f"{path.relative_to(folder)}:{line} imports {names[0]}")
    return found


def test_tests_share_code_through_support_alone(tmp_path: Path):
    found = shared_between_tests(TESTS)
    assert not found, "import it from tests/support/ instead:\n" + "\n".join(found)
    # ... and the check sees each way around support: a helper beside the tests, another test
    # module, a folder of tests, conftest.
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "runs.py").write_text("")
    (tmp_path / "workload").mkdir()
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "workload" / "test_a.py").write_text(
        "from support.runs import TINY\nimport helper\nfrom test_b import x\n"
        "from workload import y\nimport conftest\nfrom tests.support import runs\n")
    assert [f.split(" imports ")[1] for f in shared_between_tests(tmp_path)] == [
        "helper", "test_b", "workload", "conftest", "tests.support"]


def test_test_folders_cannot_shadow_a_product_package():
    """pytest puts tests/ on sys.path before the project (tests/conftest.py's folder), where a
    folder without __init__.py named gpt/ would be a namespace package that `import gpt` finds
    whenever the project is not on sys.path as well (`.venv/bin/pytest` without `python -m`):
    so tests/ mirrors gpt/ as workload/, components/ as kfp_components/, pipeline/ as
    kfp_pipeline/, bench/ as benchmarks/; and only support/ is a package, so no test module is
    importable under a product's name (`gpt.…`)."""
    folders = {p.name for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert not folders & {*PACKAGES, "bench", "tests"}, folders & {*PACKAGES, "bench", "tests"}
    packages = {p.parent.relative_to(TESTS).parts[0] for p in TESTS.rglob("__init__.py")}
    assert packages == {"support"}, packages


def test_no_two_modules_share_a_name():
    # `stages.py` in gpt/ and in components/ was two things under one name; a name says one.
    # A stage's two halves are the exception the stage table makes: gpt/<stage>.py runs it,
    # components/<stage>.py is its KFP component, both named from the stage (gpt/stages.py).
    conventional = {"__init__", "__main__", "conftest"}
    halves = {(f"gpt/{s.name.replace('-', '_')}.py", f"components/{s.name.replace('-', '_')}.py")
              for s in STAGES.values()}  # fmt: skip
    seen: dict[str, list[str]] = {}
    for folder in ("gpt", "components", "pipeline", "tests", "bench"):
        for path in sorted((PROJECT / folder).rglob("*.py")):
            if path.stem not in conventional and ".venv" not in path.parts:
                seen.setdefault(path.stem, []).append(str(path.relative_to(PROJECT)))
    assert not {name: paths for name, paths in seen.items()
                if len(paths) > 1 and tuple(sorted(paths, reverse=True)) not in halves}
