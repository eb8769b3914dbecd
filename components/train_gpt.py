"""KFP component `train-gpt`: train the GPT, PyTorch DDP (or FSDP2: `shard`) across nodes and
processes."""

from kfp import dsl
from kfp.dsl import HTML, Metrics, Model, Output

from components.step.image_names import component_image
from components.step.parameter_docs import documented


# Over 50 lines for its signature alone: KFP reads a component's parameters from it, one
# line per knob (tests/kfp_components/step/test_parameter_docs.py holds them to the knobs' fields).
@dsl.component(base_image=component_image(), install_kfp_package=False)
# @documented (components/step/parameter_docs.py) appends to __doc__'s Args: one line per parameter
# it does not describe, its knob's field docstring; @dsl.component then reads the texts.
@documented("train-gpt")
def train_gpt(
    metrics: Output[Metrics],
    report: Output[HTML],
    model: Output[Model],
    run: str,
    init_from: str = "",
    n_layer: int = -1,
    n_head: int = -1,
    n_embd: int = -1,
    block_size: int = 64,
    dropout: float = -1,
    batch_size: int = 12,
    activation_checkpointing: bool = False,
    shard: bool = False,
    lora_rank: int = 0,
    max_iters: int = 600,
    time_budget: float = 0.0,
    learning_rate: float = -1,
    warmup_iters: int = -1,
    eval_interval: int = 250,
    eval_iters: int = 200,
    log_interval: int = 10,
    ckpt_interval: int = 500,
    seed: int = 1337,
    export_uri: str = "",
    num_nodes: int = 1,
    num_proc_per_node: int = 0,
    gpus_per_node: int = 0,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "",
    storage_secret: str = "",
    timeout: float = 86400,
    start_timeout: float = 120,
    model_registry: str = "",
    model_name: str = "",
) -> str:
    """Run `torchrun -m gpt -- train-gpt` (in a TrainJob on runtime gpt-train-gpt, or locally).

    Every parameter but the outputs is a knob: its text is its field's docstring
    (components/step/parameter_docs.py), and -1 leaves a flag unset.

    Args:
        metrics: The run's final and best losses, tokens/s, steps; for a fine-tuned run, what it
            started from (init_from, init_from_revision, init_from_weights_sha256).
        report: metrics/report.md as HTML, its loss curve inlined.
        model: Where the run's model is (its metadata's model_uri: the s3:// export, else
            pvc://gpt-pvc/<run>/model) and what it is (architecture, parameters, tokenizer,
            validation bits per byte, init_from, the run).

    Returns:
        The run directory name, for the next stage.

    With `model_registry`, the run's model is then registered there (a registry that refuses
    or cannot be reached fails the step, the model already on the volume and exported).
    """
    # Every parameter above by name, as locals() holds nothing else yet; less the output
    # artifacts (deleted next), the step's knobs. run_step (components/step/dispatch.py) sorts
    # them into the stage's flags, its Placement and its StepKnobs (sort_knobs), checks the
    # flags with the stage's config (validate) and hands them to the stage as `--name value`.
    # Not written out name by name: that would be a second copy of the signature.
    knobs = dict(locals())
    del knobs["metrics"], knobs["report"], knobs["model"]
    from components.step.artifacts import train_metrics, train_provenance, train_report_html
    from components.step.dispatch import run_step
    from components.step.model_artifact import write_model_artifact
    from components.step.registration import Registration, register_run

    registration = Registration.take(knobs)  # the step's, after the stage: no flag of it
    step = run_step("train-gpt", knobs)
    for name, value in train_metrics(step.files).items():
        metrics.log_metric(name, value)
    metrics.metadata.update(train_provenance(step.files))
    with open(report.path, "w") as f:
        f.write(train_report_html(step.run_id, step.files))
    write_model_artifact(model, step, knobs)
    if registration.model_registry:  # the model is on the volume and exported by now
        register_run(registration, step, knobs)
    return step.run_id
