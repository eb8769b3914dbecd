"""The stage table (gpt/stages.py): a new stage is its row and the files no table can stand in
for, and it reaches the pipeline, its runtime and its TrainJob with no other edit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.paths import PROJECT
from support.tree import changed_files, copy_project

# What README.md and docs/architecture.md say, and the test below measures.
CLAIM = "a new stage is six files and `make compile`"

# What a copy of the project needs to compile the pipeline and run the tests that hold the stages.
PARTS = ("gpt", "components", "pipeline", "runtimes", "tests", "docker", "images.env",
         "pyproject.toml")
CONFIG = '''

@dataclass
class CountConfig(RunConfig):
    """count-tokens's flags: the run directory, and this."""

    top: int = 10
    """How many of the most frequent tokens to print."""
'''
MODULE = '''"""count-tokens: a stage a newcomer adds."""

from gpt.config.configs import CountConfig


def main(cfg: CountConfig) -> None:
    print(f"{cfg.rundir.path}: the {cfg.top} most frequent tokens")
'''
COMPONENT = '''"""KFP component `count-tokens`: a stage a newcomer adds."""

from kfp import dsl

from components.step.image_names import component_image
from components.step.parameter_docs import documented


@dsl.component(base_image=component_image(), install_kfp_package=False)
@documented("count-tokens")
def count_tokens(
    run: str,
    top: int = 10,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "",
    timeout: float = 3600,
    start_timeout: float = 120,
) -> str:
    """Run `python -m gpt count-tokens` (in a TrainJob on runtime gpt-count-tokens, or locally).

    Returns:
        The run directory name, for the next stage.
    """
    knobs = dict(locals())  # taken first: the parameters, and nothing else
    from components.step.dispatch import run_step

    return run_step("count-tokens", knobs).run_id
'''
# What the new stage reaches, read in the copy: the compiled pipeline (its step between
# train-gpt and generative-prompt, its flag a pipeline parameter) and the TrainJob its component
# creates (the launcher's own body, from the spec run_stage hands it; no cluster here).
PROBE = """
import json, yaml
from components.trainjob import launcher
from gpt.stages import STAGES
from pipeline.pipeline import component_of

spec = next(yaml.safe_load_all(open("pipeline/gpt_trainjobs_pipeline.yaml")))
tasks = spec["root"]["dag"]["tasks"]
producer = {t: tasks[t]["inputs"]["parameters"]["run"]["taskOutputParameter"]["producerTask"]
            for t in ("count-tokens", "generative-prompt")}
top = spec["root"]["inputDefinitions"]["parameters"]["top"]

specs = []
def launch(spec, namespace, run_id, **_):
    specs.append(spec)
    return launcher.Outcome(name="n", namespace=namespace, log="", files={}, elapsed_s=0.0)
launcher.launch = launch
stage = STAGES["count-tokens"]
run = component_of(stage).python_func(run="r", top=3, namespace="ns", workload_image="img:1")
job = launcher.build_trainjob(specs[0], launcher.trainjob_name(stage.name), "ns", run)
print(json.dumps({"producer": producer, "top": top, "trainjob": job}))
"""
# The tests that hold every stage (they read the stage table): they pass in the copy unedited.
HOLDERS = (
    "tests/kfp_components/step/test_parameter_docs.py::test_every_parameter_is_a_knob_with_its_type_and_default",
    "tests/kfp_components/step/test_parameter_docs.py::test_every_text_in_the_compiled_yaml_is_its_knobs",
    "tests/kfp_components/step/test_parameter_docs.py::test_the_pipeline_takes_every_steps_knob_once_with_the_steps_default",
    "tests/kfp_pipeline/test_pipeline.py::test_compiles_to_the_stages_as_chained_uncached_steps",
    "tests/kfp_pipeline/test_pipeline.py::test_committed_yaml_is_what_make_compile_writes",
    "tests/runtimes/test_runtimes.py::test_the_runtimes_follow_the_sdk_shape_and_share_the_pvc",
    "tests/runtimes/test_runtimes.py::test_the_kustomization_applies_every_stages_runtime",
)


def test_the_docs_claim_what_the_test_measures():
    for doc in ("README.md", "docs/architecture.md"):
        assert CLAIM in " ".join((PROJECT / doc).read_text().split()), doc


def edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
def test_a_new_stage_is_six_files_and_a_recompile(tmp_path):
    """Its config, its row, its module, its component, its runtime and the runtime's line in the
    kustomization; `make compile` rewrites the pipeline's YAML. The pipeline's step, its wiring
    and its parameters, the CLI and the TrainJob follow from the row. (A stage that writes a file
    no other does names it in gpt/rundir/layout.py; one that gives KFP an artifact makes it in
    components/step/artifacts.py.)"""
    tree = copy_project(tmp_path / "project", PARTS)
    configs = tree / "gpt" / "config" / "configs.py"
    configs.write_text(configs.read_text() + CONFIG)  # 1: its flags
    stages = tree / "gpt" / "stages.py"  # 2: its row, between training and talking
    edit(stages, "import CorpusConfig,", "import CorpusConfig, CountConfig,")
    edit(stages, "STAGES: dict", 'COUNT_TOKENS = Stage("count-tokens", "count the run\'s tokens", '
                                 "CountConfig, ())\nSTAGES: dict")  # fmt: skip
    edit(stages, "TRAIN_GPT, GENERATIVE_PROMPT)", "TRAIN_GPT, COUNT_TOKENS, GENERATIVE_PROMPT)")
    (tree / "gpt" / "count_tokens.py").write_text(MODULE)  # 3: what it does
    (tree / "components" / "count_tokens.py").write_text(COMPONENT)  # 4: its KFP component
    runtime = (tree / "runtimes" / "gpt-load-corpus.yaml").read_text()  # 5: its runtime
    (tree / "runtimes" / "gpt-count-tokens.yaml").write_text(
        runtime.replace("load-corpus", "count-tokens"))
    edit(tree / "runtimes" / "kustomization.yaml", "  - gpt-train-gpt.yaml\n",
         "  - gpt-train-gpt.yaml\n  - gpt-count-tokens.yaml\n")  # 6: applied with the others
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_REGISTRY", "IMAGE_TAG")}
    env["PYTHONPATH"] = str(tree)
    run = {"cwd": tree, "env": env, "text": True, "capture_output": True}
    compiled = subprocess.run([sys.executable, "-m", "pipeline", "compile"], **run)
    assert compiled.returncode == 0, compiled.stderr
    edited = sorted(changed_files(tree, PARTS))
    edited.remove("pipeline/gpt_trainjobs_pipeline.yaml")  # what `make compile` rewrote
    assert edited == ["components/count_tokens.py", "gpt/config/configs.py", "gpt/count_tokens.py",
                      "gpt/stages.py", "runtimes/gpt-count-tokens.yaml",
                      "runtimes/kustomization.yaml"]  # fmt: skip
    assert "six files" in CLAIM and len(edited) == 6

    probe = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], **run)
    assert probe.returncode == 0, probe.stderr
    reached = json.loads(probe.stdout)
    assert reached["producer"] == {"count-tokens": "train-gpt", "generative-prompt": "count-tokens"}
    assert reached["top"]["description"].endswith("How many of the most frequent tokens to print.")
    job = reached["trainjob"]
    assert job["spec"]["runtimeRef"] == {"name": "gpt-count-tokens"}
    assert job["spec"]["trainer"]["args"] == ["python", "-m", "gpt", "count-tokens", "--root",
                                              "/gpt", "--run", "r", "--top", "3"]  # fmt: skip
    cli = subprocess.run([sys.executable, "-m", "gpt", "count-tokens", "--root", str(tmp_path),
                          "--run", "r", "--top", "3"], **run)  # fmt: skip
    assert cli.stdout == f"{tmp_path / 'r'}: the 3 most frequent tokens\n", cli.stderr
    held = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           *HOLDERS], **run)  # fmt: skip
    assert held.returncode == 0, held.stdout[-3000:]
    assert "type_and_default[count-tokens] PASSED" in held.stdout
