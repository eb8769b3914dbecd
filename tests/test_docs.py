"""The docs say what the code is: every path and module they name exists, the map of gpt/ in
docs/architecture.md draws every module in its room and nothing else, docs/stages.md gives every
flag of the three stages, and the numbers and lists the docs copy from the code are the code's.

Paths are read as whole tokens (`gpt/tokenizer/ranks.py`, a folder `gpt/fetch/`, a pattern
`gpt/<stage>.py`); a path that a line break cuts after a `/` is read joined, as it reads.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from support.layers import GPT_LAYERS
from support.paths import PROJECT

from gpt.config import configs
from gpt.config.cli import build_parser
from gpt.stages import STAGES

DOCS = (PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md")),
        PROJECT / "gpt" / "assets" / "PROVENANCE.md", PROJECT / "Makefile")  # fmt: skip
# The project's top folders: a token starting with one of them is a path of this project.
ROOTS = ("gpt", "components", "pipeline", "tests", "bench", "runtimes", "manifests", "docker",
         "docs")  # fmt: skip
# Folders the benchmarks write and git ignores: named in the docs, absent until a benchmark runs.
WRITTEN = ("bench/.cache/", "bench/results/gpu/")
TOKEN = re.compile(r"[\w.<>*/-]+")
ARCHITECTURE = (PROJECT / "docs" / "architecture.md").read_text()


def doc_lines(doc: Path) -> list[str]:
    """The lines of `doc` that are prose: the Makefile's comments (its recipes are code, which
    the Makefile's tests run), every line of a Markdown file."""
    lines = doc.read_text().splitlines()
    if doc.name == "Makefile":
        return [line if line.lstrip().startswith("#") else "" for line in lines]
    return lines


def named_paths(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, path) for each path of the project the lines name: a token under one of
    ROOTS that is a folder (`gpt/fetch/`), a file (`tests/test_docs.py`) or a pattern
    (`runtimes/gpt-<stage>.yaml`). A label such as `pipeline/runid` is neither and is left out.
    A token ending in `/` at a line's end, the next line starting with a file or folder name,
    is one path cut by the wrapping: `components/step/` + `parameter_docs.py`."""
    found = []
    for number, line in enumerate(lines, 1):
        tokens = list(TOKEN.finditer(line))
        for i, match in enumerate(tokens):
            path = match.group().removeprefix("../").rstrip(".,:;")
            if path.split("/")[0] not in ROOTS or "/" not in path:
                continue
            if path.endswith("/") and i == len(tokens) - 1 and number < len(lines):
                follows = TOKEN.match(lines[number].lstrip())
                if follows and re.fullmatch(r"[\w-]+(\.\w+|/)", follows.group().rstrip(".,:;")):
                    path += follows.group().rstrip(".,:;")
            last = path.rstrip("/").split("/")[-1]
            if path.endswith("/") or "." in last or any(c in path for c in "<*"):
                found.append((number, path))
    return found


def exists(path: str) -> bool:
    if path.startswith(WRITTEN):
        return True
    pattern = re.sub(r"<[^>]*>", "*", path)
    if "*" in pattern:
        return any(PROJECT.glob(pattern.rstrip("/")))
    return (PROJECT / path).is_dir() if path.endswith("/") else (PROJECT / path).exists()


def test_the_path_reader_reads_folders_files_patterns_and_wrapped_paths():
    lines = ["see gpt/fetch/ and `tests/test_docs.py`, `runtimes/gpt-<stage>.yaml`;",
             "the label `pipeline/runid`, the peer ../bench/finetune.py and (components/step/",
             "parameter_docs.py) here, kubectl apply -k runtimes/", "kubectl get pods"]
    assert named_paths(lines) == [
        (1, "gpt/fetch/"), (1, "tests/test_docs.py"), (1, "runtimes/gpt-<stage>.yaml"),
        (2, "bench/finetune.py"), (2, "components/step/parameter_docs.py"), (3, "runtimes/"),
    ]  # fmt: skip
    assert exists("runtimes/gpt-<stage>.yaml") and exists("gpt/fetch/")
    assert not exists("gpt/tokenizer.py") and not exists("gpt/errors.py/")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(PROJECT)))
def test_every_path_the_docs_name_exists(doc: Path):
    missing = [f"line {n}: {p}" for n, p in named_paths(doc_lines(doc)) if not exists(p)]
    assert not missing, f"{doc.relative_to(PROJECT)} names what is not there: {missing}"


def module_file(dotted: str) -> Path | None:
    """The file of a dotted module name (`support.runs` is tests/support/runs.py)."""
    parts = dotted.split(".")
    base = PROJECT / "tests" if parts[0] == "support" else PROJECT
    for candidate in (base.joinpath(*parts).with_suffix(".py"),
                      base.joinpath(*parts, "__init__.py")):  # fmt: skip
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def resolves(dotted: str) -> bool:
    """`gpt.distributed.torchrun` is a module; `support.runs.in_process` a module's name (one
    level down: a module's own function, class or constant)."""
    if module_file(dotted):
        return True
    module, _, name = dotted.rpartition(".")
    path = module_file(module) if module else None
    return path is not None and name in top_level_names(path)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(PROJECT)))
def test_every_module_the_docs_name_exists(doc: Path):
    """`python -m gpt.distributed.torchrun`, `support.runs.in_process`: the dotted spelling of a
    module moves with it as its path does."""
    dotted = re.compile(r"(?<![\w./-])(?:gpt|components|pipeline|bench|support)(?:\.[A-Za-z_]\w*)+")
    missing = [f"line {n}: {m}" for n, line in enumerate(doc_lines(doc), 1)
               for m in dotted.findall(line)
               if not re.search(r"\.(py|md|yaml|json|txt)$", m) and not resolves(m)]
    assert not missing, f"{doc.relative_to(PROJECT)} names no such module: {missing}"


def gpt_tree() -> tuple[set[str], set[str]]:
    """docs/architecture.md's drawing of gpt/: (the rooms it draws, the modules it names in
    them). A line starts with a name when it draws one: a room `training/`, or a module at
    gpt/'s top followed by two spaces, `train_gpt.py  ...`; the modules named after it are in
    that room (or at the top), a name with a folder (`data/corpus.py`) under gpt/."""
    block = ARCHITECTURE.split("\n```\ngpt/\n", 1)[1].split("\n```\n", 1)[0]
    rooms, modules = set(), set()
    room = ""
    for line in block.splitlines():
        drawn = re.match(r" *(\w+/(?= |$)|[\w.]+\.py(?=  |$))", line)
        text = line
        if drawn:
            name, text = drawn.group(1), line[drawn.end():]
            room = name.rstrip("/") if name.endswith("/") else ""
            if room:
                rooms.add(f"gpt/{room}")
            else:
                modules.add(f"gpt/{name}")
        for name in re.findall(r"[\w./]+?\.py\b", text):
            if name.startswith("gpt/"):
                modules.add(name)
            elif "/" in name:
                modules.add(f"gpt/{name}")
            else:
                modules.add(f"gpt/{room}/{name}" if room else f"gpt/{name}")
    return rooms, modules


def test_the_map_of_gpt_draws_its_rooms_in_their_layers():
    """The map's indentation is the import layers (a room imports only the rooms drawn deeper):
    each room, and each module at gpt/'s top, indented as deep as its layer in GPT_LAYERS."""
    block = ARCHITECTURE.split("\n```\ngpt/\n", 1)[1].split("\n```\n", 1)[0]
    drawn = {}
    for line in block.splitlines():
        if m := re.match(r"( *)(\w+)(?:/(?= |$)|\.py(?=  |$))", line):
            drawn[m.group(2)] = len(m.group(1))
    depths = sorted(set(drawn.values()))
    layer_of = {room: n for n, layer in enumerate(GPT_LAYERS) for room in layer}
    assert {room: depths.index(d) for room, d in drawn.items()} == layer_of


def test_the_map_of_gpt_draws_what_is_there():
    rooms, modules = gpt_tree()
    assert len(rooms) > 5 and len(modules) > 40  # the drawing was read
    missing = [r for r in sorted(rooms) if not (PROJECT / r).is_dir()]
    missing += [m for m in sorted(modules) if not (PROJECT / m).is_file()]
    assert not missing, f"docs/architecture.md's map of gpt/ draws what is not there: {missing}"


def test_the_map_of_gpt_draws_every_module_in_its_room():
    _, drawn = gpt_tree()
    there = {str(p.relative_to(PROJECT)) for p in (PROJECT / "gpt").rglob("*.py")
             if p.name != "__init__.py"}  # fmt: skip
    left_out = sorted(there - drawn)
    assert not left_out, f"docs/architecture.md's map of gpt/ leaves out {left_out}"


def stage_flags() -> set[str]:
    """Every flag of the three stages, as their parsers (gpt/config/cli.py) spell it first."""
    return {action.option_strings[0] for stage in STAGES.values()
            for action in build_parser(stage.config, stage.prog, stage.summary)._actions
            if action.option_strings[0] != "-h"}  # fmt: skip


STAGES_MD = (PROJECT / "docs" / "stages.md").read_text()
# Flags docs/stages.md gives that are not a stage's: torchrun's own, and the hyphenated
# spelling the CLI also takes (`--idle-timeout`).
OTHER_FLAGS = {"--help", "--standalone", "--nproc_per_node", "--max-restarts", "--run-path",
               "--shutdown_timeout", "--idle-timeout"}  # fmt: skip


def test_stages_md_gives_every_flag_of_the_three_stages():
    given = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", STAGES_MD))
    left_out = sorted(stage_flags() - given)
    assert not left_out, f"docs/stages.md leaves out {left_out}"


def test_every_flag_stages_md_gives_is_a_stages_or_torchruns():
    given = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", STAGES_MD))
    unknown = sorted(given - stage_flags() - OTHER_FLAGS)
    assert not unknown, f"docs/stages.md gives flags no stage has: {unknown}"


def constant(path: Path, name: str) -> object:
    """A module-level constant of a test module, read from its source (tests share no code
    but through tests/support/, so the module is not imported)."""
    for node in ast.parse(path.read_text()).body:
        targets = [getattr(t, "id", None) for t in getattr(node, "targets", [])]
        if isinstance(node, ast.Assign) and targets == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no {name}")


def test_the_readme_says_how_often_the_crash_safety_test_kills():
    test = "tests/kfp_pipeline/test_crash_safety.py"
    kills = constant(PROJECT / test, "KILLS_PER_STAGE")
    times = {1: "once", 2: "twice"}[kills]  # a count the README spells as a word
    stages = {3: "three"}[len(STAGES)]
    readme = " ".join((PROJECT / "README.md").read_text().split())
    said = re.search(rf"`{re.escape(test)}` kills it [^(]*?stages", readme)
    assert said, "README.md no longer says how the crash-safety test kills the demo"
    true = f"`{test}` kills it {times} in each of the {stages} stages"
    assert said.group() == true, (f"README.md says {said.group()!r}; KILLS_PER_STAGE = {kills} "
                                  f"says {true!r}")  # fmt: skip


def table_row(first_cell: str) -> str:
    """The row of a docs/architecture.md table whose first cell is `first_cell`."""
    rows = [line for line in ARCHITECTURE.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, first_cell
    return rows[0]


def test_the_glossary_names_every_config_class():
    classes = {name for name, obj in vars(configs).items()
               if dataclasses.is_dataclass(obj) and obj.__module__ == configs.__name__}
    named = set(re.findall(r"`(\w+Config)`", table_row("config")))
    assert len(classes) > 5
    assert named == classes, (f"the glossary's config row names {sorted(named - classes)} "
                              f"and leaves out {sorted(classes - named)}")


def test_the_layer_table_names_every_component_module():
    """The `components/` row names its modules by their folder: `dispatch.py` after `step/`."""
    folder, named = "components", set()
    for name in re.findall(r"`([\w./]+)`", table_row("`components/`").split(" | ")[1]):
        if name.endswith("/"):
            folder = f"components/{name.rstrip('/')}"
        elif name.endswith(".py"):
            named.add(f"{folder}/{name}")
    there = {str(p.relative_to(PROJECT)) for p in (PROJECT / "components").rglob("*.py")
             if p.name != "__init__.py"}  # fmt: skip
    assert named == there, (f"the layer table's components/ row names {sorted(named - there)} "
                            f"and leaves out {sorted(there - named)}")


def rooms_of(folder: Path) -> set[str]:
    return {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def test_the_readme_names_every_room_of_gpt():
    readme = " ".join((PROJECT / "README.md").read_text().split())
    said = re.search(r"a folder per concern beneath \(([^)]*)\)", readme)
    assert said, "README.md no longer lists gpt/'s folders"
    named = set(re.findall(r"`([\w/]+)`", said.group(1)))
    there = rooms_of(PROJECT / "gpt")
    assert named == there, (f"README.md's layout names {sorted(named - there)} and leaves out "
                            f"{sorted(there - named)} of gpt/")  # fmt: skip


def test_the_tests_table_names_every_folder_of_tests_workload():
    """The row of tests/'s table that names what tests gpt/: `workload/` and its room folders."""
    row = [line for line in ARCHITECTURE.splitlines() if line.startswith("| `workload/` (and ")]
    assert len(row) == 1, "docs/architecture.md's tests table has no workload/ row"
    named = set(re.findall(r"`([\w/]+)`", row[0].split(" | ")[0])) - {"workload/"}
    there = rooms_of(PROJECT / "tests" / "workload")
    assert named == there, (f"the tests table's workload/ row names {sorted(named - there)} and "
                            f"leaves out {sorted(there - named)}")  # fmt: skip


def test_architecture_md_names_every_module_tests_share():
    """"What tests share" and "The test cluster" name each module of tests/support/."""
    sections = ARCHITECTURE.split("\n## What tests share", 1)[1].split("\n## Traps", 1)[0]
    named = set(re.findall(r"[\w.]+\.py|\w+/", sections))
    support = PROJECT / "tests" / "support"
    there = {p.name for p in [*support.glob("*.py"), *(support / "cluster").glob("*.py")]
             if p.name != "__init__.py"} | rooms_of(support)  # fmt: skip
    assert not there - named, f"docs/architecture.md leaves out {sorted(there - named)}"


def test_stages_md_gives_the_memory_estimates_table_as_the_estimate_makes_it():
    from bench.memory_table import table

    indented = "\n".join("  " + line for line in table().splitlines())
    assert indented in STAGES_MD, "docs/stages.md: run python -m bench.memory_table, paste it"
