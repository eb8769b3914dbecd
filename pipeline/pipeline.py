"""`gpt_trainjobs_pipeline`: the stage table's stages as steps, in its order (gpt/stages.py):
load-corpus -> train-gpt -> generative-prompt; with `serve` set, also deploy-model after train-gpt.

Each step creates a Kubeflow Trainer TrainJob (backend="trainjob") or runs the stage as a local
process (backend="local"); the stages share the run directory `<root>/<run>/`, whose name each
step hands the next. The pipeline's parameters are its steps' (pipeline/parameters.py): the
CLI's names, defaults and texts (one name per knob), one value for a knob several steps share.
A new stage's step follows from its row and its component (components/<stage>.py); only a
deadline of its own as a pipeline parameter is a line here (DEADLINES). The deploy step
(components/deploy_model.py) is no stage: it creates no TrainJob, and runs only where `serve` is
set (`dsl.If`), so the default pipeline runs the three stages alone.
"""

import importlib

from kfp import dsl, kubernetes
from kfp.dsl.base_component import BaseComponent

from components.deploy_model import deploy_model
from components.step.context import NAMESPACE_ENV, RUN_ID_ENV, RUN_ID_LABEL
from components.step.image_names import workload_image
from gpt.stages import STAGES, Stage
from pipeline.parameters import PipelineParameters, with_step_parameters

NAME = "gpt-trainjobs"


def component_of(stage: Stage) -> BaseComponent:
    """The stage's KFP component: the function named as the stage (`train_gpt`) in its
    component module (components/train_gpt.py)."""
    module = importlib.import_module(stage.component_module)
    return getattr(module, stage.name.replace("-", "_"))


STEPS = [component_of(stage) for stage in STAGES.values()]
FIRST = STEPS[0].name
# The step after a stage that is no stage: the stage it follows, whose run it serves.
DEPLOY, DEPLOY_AFTER = deploy_model, "train-gpt"
# A step's own deadline, as a pipeline parameter of its own name (steps differ: loading, training
# and talking take different times); a step not named here keeps its component's (load-corpus's).
DEADLINES = {"train-gpt": "train_timeout", "generative-prompt": "prompt_timeout"}


def wired(step: BaseComponent) -> set[str]:
    """The step's parameters the pipeline sets itself: the first step's run id (the KFP run's),
    every other step's run directory (from the step before), a deadline not in DEADLINES."""
    own = {"kfp_run_id"} if step.name == FIRST else {"run"}
    return own if step.name in DEADLINES or step is DEPLOY else own | {"timeout"}


def from_its_pod(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """`task` uncached, knowing its namespace and run id from its own pod."""
    # Every step creates a TrainJob (or an InferenceService) and writes the PVC: a cached step
    # would skip both.
    task.set_caching_options(False)
    # The step's own namespace, and its run id where a KFP backend before 2.5 leaves
    # PIPELINE_JOB_ID_PLACEHOLDER unresolved: from its pod, through the downward API.
    kubernetes.use_field_path_as_env(task, NAMESPACE_ENV, "metadata.namespace")
    kubernetes.use_field_path_as_env(task, RUN_ID_ENV, f"metadata.labels['{RUN_ID_LABEL}']")
    return task


@dsl.pipeline(
    name=NAME,
    description="Train a GPT from scratch with Kubeflow Trainer TrainJobs, then talk to it.",
)
@with_step_parameters(
    [*STEPS, DEPLOY],
    wired={step.name: wired(step) for step in [*STEPS, DEPLOY]},
    renamed={name: {"timeout": parameter} for name, parameter in DEADLINES.items()},
    # fixed when the pipeline compiles (images.env, or IMAGE_REGISTRY/IMAGE_TAG); a run may
    # override it, e.g. with a CUDA build
    defaults={"workload_image": workload_image()},
)
def gpt_trainjobs_pipeline(parameters: PipelineParameters):
    """The stage table's steps in its order, each taking the run from the step before; with
    `serve` set, the deploy step after train-gpt, on its run."""
    before = None  # the step before: its output is the run directory's name
    tasks = {}
    for step in STEPS:
        if before is None:
            task = step(**parameters.of(step), kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        else:
            task = step(**parameters.of(step), run=before.outputs["Output"])
        tasks[step.name] = before = from_its_pod(task)
    # An empty `serve` (the default) skips it; any other value runs it, and it refuses a value
    # it does not know in one line (components/step/deployment.py).
    with dsl.If(parameters["serve"] != "", name="serve"):
        from_its_pod(DEPLOY(**parameters.of(DEPLOY),
                            run=tasks[DEPLOY_AFTER].outputs["Output"]))

