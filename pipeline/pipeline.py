"""`gpt_trainjobs_pipeline`: load-corpus -> train-gpt -> generative-prompt.

Each step creates a Kubeflow Trainer TrainJob (backend="trainjob") or runs the stage as a local
process (backend="local"); the stages share the run directory `<root>/<run>/`, whose name each
step hands the next. The pipeline's parameters are its steps' (pipeline/parameters.py): the
CLI's names, defaults and texts (one name per knob), one value for a knob several steps share.
"""

from kfp import dsl, kubernetes

from components.generative_prompt import generative_prompt
from components.load_corpus import load_corpus
from components.step.context import NAMESPACE_ENV, RUN_ID_ENV, RUN_ID_LABEL
from components.step.image_names import workload_image
from components.train_gpt import train_gpt
from pipeline.parameters import Knobs, with_step_parameters

NAME = "gpt-trainjobs"


@dsl.pipeline(
    name=NAME,
    description="Train a GPT from scratch with Kubeflow Trainer TrainJobs, then talk to it.",
)
@with_step_parameters(
    [load_corpus, train_gpt, generative_prompt],
    # set by the pipeline itself: the run id, and each step's run directory from the step before
    wired={"load-corpus": {"kfp_run_id", "timeout"}, "train-gpt": {"run"},
           "generative-prompt": {"run"}},  # fmt: skip
    # each step's own deadline (load-corpus keeps its component's)
    renamed={"train-gpt": {"timeout": "train_timeout"},
             "generative-prompt": {"timeout": "prompt_timeout"}},  # fmt: skip
    # fixed when the pipeline compiles (images.env, or IMAGE_REGISTRY/IMAGE_TAG); a run may
    # override it, e.g. with a CUDA build
    defaults={"workload_image": workload_image()},
)
def gpt_trainjobs_pipeline(knobs: Knobs):
    """load-corpus -> train-gpt -> generative-prompt."""
    corpus = load_corpus(**knobs.of(load_corpus), kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    train = train_gpt(**knobs.of(train_gpt), run=corpus.outputs["Output"])
    chat = generative_prompt(**knobs.of(generative_prompt), run=train.outputs["Output"])
    for task in (corpus, train, chat):
        # Every step creates a TrainJob and writes the PVC: a cached step would skip both.
        task.set_caching_options(False)
        # The step's own namespace, and its run id where a KFP backend before 2.5 leaves
        # PIPELINE_JOB_ID_PLACEHOLDER unresolved: from its pod, through the downward API.
        kubernetes.use_field_path_as_env(task, NAMESPACE_ENV, "metadata.namespace")
        kubernetes.use_field_path_as_env(task, RUN_ID_ENV, f"metadata.labels['{RUN_ID_LABEL}']")
