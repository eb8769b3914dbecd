"""KFP component `load-corpus`: fetch, clean and tokenize a text into the run directory."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components.step.image_names import component_image


@dsl.component(base_image=component_image(), install_kfp_package=False)
def load_corpus(
    corpus_stats: Output[Metrics],
    run: str = "",
    kfp_run_id: str = "",
    source: str = "default",
    tokenizer: str = "gpt2",
    compact: bool = True,
    max_vocab: int = 8192,
    val_fraction: float = 0.1,
    block_size: int = 256,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "",
    storage_secret: str = "",
    timeout: float = 1800,
    start_timeout: float = 120,
) -> str:
    """Run `python -m gpt load-corpus` (in a TrainJob on runtime gpt-load-corpus, or locally).

    Args:
        run: Run directory name under root; empty: the KFP run id (`kfp_run_id`).
        kfp_run_id: The pipeline passes its run id here (dsl.PIPELINE_JOB_ID_PLACEHOLDER); a KFP
            backend before 2.5 passes it unresolved, and then the step pod's `pipeline/runid`
            label stands in (components/step/context.py).
        source: URL, file or directory of .txt files, s3:// or gs:// object or prefix/ (its
            .txt objects), or 'default' (the embedded corpus).
        tokenizer: gpt2 or char.
        compact: gpt2 only: keep just the tokens the corpus uses.
        max_vocab: gpt2 compacted: at most this many tokens, the most frequent; 0: no limit.
        val_fraction: Fraction of the text, from its end, held out for validation.
        block_size: Context length training will use.
        root: Directory of run directories: /gpt (the PVC) for trainjob, any folder for local.
        backend: trainjob (a Kubeflow Trainer TrainJob) or local (a process here).
        workload_image: Image the TrainJob runs (the pipeline sets it from images.env).
        namespace: Namespace of the TrainJob; empty: the step's own (its pod's namespace).
        storage_secret: Secret in that namespace whose AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
            (and AWS_ENDPOINT_URL, AWS_REGION, ... where present) the TrainJob takes as its
            variables, for s3:// URIs; empty: none (IRSA, or no object storage).
        timeout: Seconds before the TrainJob is deleted and the step fails.
        start_timeout: Seconds a TrainJob may go without a pod, and each pod may stay Pending
            (unschedulable, image not pulled), before the step fails with the reason.

    Returns:
        The run directory name, for the next stages.
    """
    from components.step.artifacts import corpus_metrics
    from components.step.context import run_id
    from components.step.dispatch import run_stage
    from components.trainjob.placement import Placement

    run = run or run_id(kfp_run_id)
    files = run_stage(
        "load-corpus",
        dict(
            root=root,
            run=run,
            source=source,
            tokenizer=tokenizer,
            compact=compact,
            max_vocab=max_vocab,
            val_fraction=val_fraction,
            block_size=block_size,
        ),
        Placement(timeout=timeout, start_timeout=start_timeout),
        backend=backend,
        image=workload_image,
        namespace=namespace,
        storage_secret=storage_secret,
    )
    for name, value in corpus_metrics(files).items():
        corpus_stats.log_metric(name, value)
    return run
