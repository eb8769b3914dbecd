"""One knob, one place: every parameter of a component and of the pipeline is a knob written once
(a dataclass field and its docstring), and each signature, default and text follows from it or
is held equal to it here; adding a training flag end to end is two edits."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import types
import typing

import pytest
import yaml
from support.paths import PROJECT
from support.tree import copy_project

from components.step.dispatch import UNSET, StepKnobs, sort_knobs
from components.step.parameter_docs import documented, knob_docs
from components.step.registration import Registration
from components.trainjob.placement import Placement
from gpt.stages import STAGES
from pipeline.parameters import with_step_parameters
from pipeline.pipeline import DEADLINES, DEPLOY, STEPS, gpt_trainjobs_pipeline

COMPONENTS = {step.name: step for step in STEPS}
# Where a component's default is the step's own, not the knob's, and why.
STEP_DEFAULTS = {
    "root": "/gpt",  # the runtimes mount PVC gpt-pvc there (the CLI's: a folder `runs`)
    "idle_timeout": 600,  # a prompt pod nobody attaches to ends (the CLI waits forever)
}
# A step's deadline is its own: loading, training and talking take different times (a step not
# named here has the knob's).
TIMEOUTS = {"load-corpus": 1800, "train-gpt": 86400, "generative-prompt": 3600}


def knob_fields(stage_name: str) -> dict[str, dataclasses.Field]:
    stage = STAGES[stage_name]
    fields = [*dataclasses.fields(StepKnobs), *dataclasses.fields(Placement),
              *dataclasses.fields(Registration), *dataclasses.fields(stage.config)]  # fmt: skip
    return {f.name: f for f in fields}


def kfp_type(hint: object) -> object:
    """The annotation a KFP parameter has for a field of type `hint` (KFP has no None, no
    Literal, and a list parameter is a plain `list`)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    if typing.get_origin(hint) is list:
        return list
    return hint


def field_default(f: dataclasses.Field) -> object:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return UNSET if f.default is None else f.default


@pytest.mark.parametrize("stage_name", list(COMPONENTS))
def test_every_parameter_is_a_knob_with_its_type_and_default(stage_name):
    component = COMPONENTS[stage_name]
    fields = knob_fields(stage_name)
    hints = {**typing.get_type_hints(StepKnobs), **typing.get_type_hints(Placement),
             **typing.get_type_hints(Registration),
             **typing.get_type_hints(STAGES[stage_name].config)}  # fmt: skip
    inputs = component.component_spec.inputs
    params = {n: p for n, p in inspect.signature(component.python_func).parameters.items()
              if n in inputs}  # fmt: skip
    assert {"root", "run"} <= params.keys()  # every stage's, whatever else it has
    for name, p in params.items():
        assert name in fields, f"{stage_name}({name}): no knob of that name"
        assert p.annotation == kfp_type(hints[name]), f"{stage_name}({name}): type"
        if name == "run":  # load-corpus: empty, the KFP run id; the others: the step before's
            assert p.default in ("", inspect.Parameter.empty)
            continue
        want = STEP_DEFAULTS.get(name, field_default(fields[name]))
        if name == "timeout":
            want = TIMEOUTS.get(stage_name, want)
        assert p.default == want, f"{stage_name}({name}): default {p.default!r} != {want!r}"


@pytest.mark.process
def test_every_text_in_the_compiled_yaml_is_its_knobs(tmp_path):
    out = tmp_path / "p.yaml"
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_REGISTRY", "IMAGE_TAG")}
    subprocess.run([sys.executable, "-m", "pipeline", "compile", "--output", str(out)],
                   cwd=PROJECT, env=env, check=True, capture_output=True)  # fmt: skip
    spec = next(yaml.safe_load_all(out.read_text()))
    seen = 0
    for stage_name in COMPONENTS:
        docs = knob_docs(STAGES[stage_name])
        comp = spec["components"][f"comp-{stage_name}"]["inputDefinitions"]["parameters"]
        for name, p in comp.items():
            if name != "run":  # a component's own line (where its run id comes from)
                assert " ".join(p["description"].split()) == docs[name], (stage_name, name)
                seen += 1
    assert seen >= 40
    pipeline_params = spec["root"]["inputDefinitions"]["parameters"]
    components: dict = {}  # the first step's text of a knob steps share (load-corpus's run)
    for c in [*COMPONENTS.values(), DEPLOY]:  # and the deploy step's own (serve, ...)
        for n, p in c.component_spec.inputs.items():
            components.setdefault(n, p)
    for name, p in pipeline_params.items():
        own = "timeout" if name in DEADLINES.values() else name
        text = " ".join(p["description"].split())
        assert text.endswith(" ".join(components[own].description.split())), name


def test_the_pipeline_takes_every_steps_knob_once_with_the_steps_default():
    params = inspect.signature(gpt_trainjobs_pipeline.pipeline_func).parameters
    for component in COMPONENTS.values():
        for name, p in inspect.signature(component.python_func).parameters.items():
            if name not in component.component_spec.inputs or name in ("run", "kfp_run_id",
                                                                      "timeout"):
                continue
            if name == "workload_image":  # fixed when the pipeline compiles (images.env)
                assert params[name].default.endswith(":" + params[name].default.split(":")[-1])
                continue
            assert (params[name].annotation, params[name].default) == (p.annotation, p.default)
    for stage_name, deadline in DEADLINES.items():
        assert params[deadline].default == TIMEOUTS[stage_name]
    assert params["run"].default == ""  # load-corpus's: the KFP run id


def cluster_md_names(starting: str, ending: str) -> set[str]:
    """The `names` docs/cluster.md gives between two phrases."""
    text = " ".join((PROJECT / "docs" / "cluster.md").read_text().split())
    start = text.index(starting)
    return set(re.findall(r"`(\w+)`", text[start:text.index(ending, start)]))


def test_cluster_md_names_the_pipeline_parameters_and_the_flags_left_at_their_default():
    params = inspect.signature(gpt_trainjobs_pipeline.pipeline_func).parameters
    assert cluster_md_names("The pipeline's parameters are", "Keep `backend") == params.keys()
    taken = {name for step in STEPS for name in step.component_spec.inputs}
    left = {f.name for stage in STAGES.values() for f in dataclasses.fields(stage.config)} - taken
    assert cluster_md_names("Left at their CLI default:", "`python -m gpt") == left


def test_steps_that_disagree_on_a_shared_knob_are_refused():
    def step(name: str, seed_default: int) -> types.SimpleNamespace:
        def func(seed: int = seed_default) -> None: ...

        inputs = {"seed": types.SimpleNamespace(description="Seed.")}
        return types.SimpleNamespace(name=name, python_func=func,
                                     component_spec=types.SimpleNamespace(inputs=inputs))

    with pytest.raises(TypeError, match=r"^pipeline parameter `seed`: a has int = 1, b has "
                                        r"int = 2; give one of them its own name"):
        with_step_parameters([step("a", 1), step("b", 2)], wired={}, renamed={}, defaults={})
    with_step_parameters([step("a", 1), step("b", 1)], wired={}, renamed={}, defaults={})


def test_a_clash_of_step_deadlines_is_one_line_naming_both_steps_and_values():
    """Each step's `timeout` has its own default: not renamed, they clash, and the error says
    where in one line (a new stage's component meets this first)."""
    with pytest.raises(TypeError) as refused:
        with_step_parameters([COMPONENTS["load-corpus"], COMPONENTS["train-gpt"]],
                             wired={"train-gpt": {"run"}}, renamed={}, defaults={})
    assert str(refused.value) == (
        "pipeline parameter `timeout`: load-corpus has float = 1800, train-gpt has float = "
        "86400; give one of them its own name (`renamed`) or make them agree"
    )


def test_a_parameter_that_is_no_knob_is_refused():
    with pytest.raises(TypeError, match=r"f\(n_layers\): no knob of that name"):
        @documented("train-gpt")
        def f(n_layers: int = 4):
            """F."""

    with pytest.raises(ValueError, match="n_layers: not a flag of train-gpt nor a knob of its"):
        sort_knobs(STAGES["train-gpt"], {"run": "r", "n_layers": 4})


def test_unset_is_minus_one_in_every_component_and_leaves_the_flag_out():
    flags, placement, step = sort_knobs(
        STAGES["train-gpt"],
        {"run": "r", "dropout": UNSET, "warmup_iters": UNSET, "max_iters": -1, "num_nodes": 2,
         "backend": "local", "export_uri": ""},
    )
    # dropout and warmup_iters default to None (automatic); max_iters has a default of its own,
    # so -1 stays -1 there (and the config refuses it, naming the flag).
    # export_uri's default is the empty text (no copy): left out too, not `--export_uri ''`.
    assert flags == {"run": "r", "dropout": None, "warmup_iters": None, "max_iters": -1,
                     "export_uri": None}
    # an empty text where the default is another stays, for the config to refuse
    assert sort_knobs(STAGES["train-gpt"], {"run": "r", "root": ""})[0]["root"] == ""
    assert placement.num_nodes == 2 and step.backend == "local"


@pytest.mark.process
def test_a_new_training_flag_is_two_edits(tmp_path):
    """The field with its docstring, and the component's signature line: the CLI, the
    component's text, the pipeline's parameter and text, and the TrainJob's command follow."""
    tree = copy_project(tmp_path / "project", ("gpt", "components", "pipeline", "images.env"))
    config = tree / "gpt" / "config" / "configs.py"
    text = config.read_text()
    anchor = text.index("    def __post_init__", text.index("class TrainConfig("))
    config.write_text(text[:anchor] + '    fresh_knob: int = 7\n    """A flag a newcomer adds, '
                      'described once."""\n\n' + text[anchor:])  # edit 1
    component = tree / "components" / "train_gpt.py"
    text = component.read_text()
    component.write_text(text.replace("    seed: int = 1337,\n",
                                      "    seed: int = 1337,\n    fresh_knob: int = 7,\n", 1))
    assert component.read_text() != text  # edit 2
    probe = """
import sys, yaml
from kfp import compiler
from pipeline.pipeline import gpt_trainjobs_pipeline
from components.step.dispatch import sort_knobs, validate
from gpt.stages import STAGES
compiler.Compiler().compile(gpt_trainjobs_pipeline, "p.yaml")
spec = next(yaml.safe_load_all(open("p.yaml")))
p = spec["root"]["inputDefinitions"]["parameters"]["fresh_knob"]
c = spec["components"]["comp-train-gpt"]["inputDefinitions"]["parameters"]["fresh_knob"]
t = spec["root"]["dag"]["tasks"]["train-gpt"]["inputs"]["parameters"]["fresh_knob"]
print(p["defaultValue"], p["description"], c["description"], t["componentInputParameter"])
stage = STAGES["train-gpt"]
flags, placement, step = sort_knobs(stage, {"root": "/tmp/r", "run": "r", "fresh_knob": 9})
print(validate(stage, flags, placement, backend="local", image="", namespace=""))
"""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, text=True,
                         capture_output=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    compiled, args = out.stdout.splitlines()
    assert compiled == ("7.0 A flag a newcomer adds, described once. A flag a newcomer adds, "
                        "described once. fresh_knob")
    assert "'--fresh_knob', '9'" in args
    helped = subprocess.run([sys.executable, "-m", "gpt", "train-gpt", "--help"], cwd=tree,
                            env=env, text=True, capture_output=True)  # fmt: skip
    assert "--fresh_knob" in helped.stdout and "described once. (default: 7)" in helped.stdout
