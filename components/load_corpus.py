"""KFP component `load-corpus`: fetch, clean and tokenize a text into the run directory."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components.step.image_names import component_image
from components.step.parameter_docs import documented


@dsl.component(base_image=component_image(), install_kfp_package=False)
# @documented (components/step/parameter_docs.py) appends to __doc__'s Args: one line per parameter
# it does not describe, its knob's field docstring; @dsl.component then reads the texts.
@documented("load-corpus")
def load_corpus(
    corpus_stats: Output[Metrics],
    run: str = "",
    kfp_run_id: str = "",
    source: str = "default",
    text_field: str = "text",
    chat: bool = False,
    init_from: str = "",
    tokenizer: str = "gpt2",
    compact: bool = True,
    max_vocab: int = 8192,
    val_fraction: float = 0.1,
    block_size: int = 64,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "",
    storage_secret: str = "",
    timeout: float = 1800,
    start_timeout: float = 120,
) -> str:
    """Run `python -m gpt load-corpus` (in a TrainJob on runtime gpt-load-corpus, or locally).

    Every parameter but the output is a knob: its text is its field's docstring
    (components/step/parameter_docs.py).

    Args:
        corpus_stats: The corpus's size in bytes and tokens, its vocabulary, its splits.
        run: Run directory name under root; empty: this KFP run's id.

    Returns:
        The run directory name, for the next stages.
    """
    # Every parameter above by name, as locals() holds nothing else yet; less the output
    # artifact (deleted next), the step's knobs. run_step (components/step/dispatch.py) sorts
    # them into the stage's flags, its Placement and its StepKnobs (sort_knobs), checks the
    # flags with the stage's config (validate) and hands them to the stage as `--name value`.
    # Not written out name by name: that would be a second copy of the signature.
    knobs = dict(locals())
    del knobs["corpus_stats"]
    from components.step.artifacts import corpus_metrics
    from components.step.dispatch import run_step

    step = run_step("load-corpus", knobs)
    for name, value in corpus_metrics(step.files).items():
        corpus_stats.log_metric(name, value)
    return step.run_id
