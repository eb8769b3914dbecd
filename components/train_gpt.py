"""KFP component `train-gpt`: train the GPT, PyTorch DDP across nodes and processes."""

from kfp import dsl
from kfp.dsl import HTML, Metrics, Output

from components.step.image_names import component_image


@dsl.component(base_image=component_image(), install_kfp_package=False)
def train_gpt(
    metrics: Output[Metrics],
    report: Output[HTML],
    run: str,
    n_layer: int = 4,
    n_head: int = 4,
    n_embd: int = 128,
    block_size: int = 64,
    dropout: float = -1.0,
    batch_size: int = 12,
    max_iters: int = 600,
    time_budget: float = 0.0,
    learning_rate: float = 1e-3,
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
) -> str:
    """Run `torchrun -m gpt -- train-gpt` (in a TrainJob on runtime gpt-train-gpt, or locally).

    Args:
        run: Run directory name under root (load-corpus returns it).
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        n_embd: Embedding width.
        block_size: Context length in tokens.
        dropout: Dropout probability; -1: 0.2 if the run trains on more tokens than its
            training split holds, else 0.
        batch_size: Sequences per optimizer step, over all processes.
        max_iters: Optimizer steps at most.
        time_budget: Seconds of training at most (0: no limit; a budget is not reproducible).
        learning_rate: Peak learning rate.
        warmup_iters: Warmup steps, fewer than max_iters; -1: 30, at most max_iters / 4.
        eval_interval: Steps between validation evaluations.
        eval_iters: Validation batches per evaluation, at most.
        log_interval: Steps between metrics lines.
        ckpt_interval: Steps between checkpoints, which a restarted or re-run step resumes from.
        seed: Seed of initialization and batch order.
        export_uri: Also copy the finished model/ to this s3:// or gs:// prefix, its manifest
            gpt-export.json last; empty: no copy.
        num_nodes: Training nodes (TrainJob numNodes; trainjob backend only).
        num_proc_per_node: Processes per node (TrainJob numProcPerNode; torchrun when > 1);
            0: one per GPU (gpus_per_node), else 1.
        gpus_per_node: NVIDIA GPUs to request per node (TrainJob resourcesPerNode); 0: none.
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
        The run directory name, for the next stage.
    """
    from components.step.artifacts import train_metrics, train_report_html
    from components.step.dispatch import run_stage
    from components.trainjob.placement import Placement

    placement = Placement(
        num_nodes=num_nodes,
        num_proc_per_node=num_proc_per_node,
        gpus_per_node=gpus_per_node,
        timeout=timeout,
        start_timeout=start_timeout,
    )
    files = run_stage(
        "train-gpt",
        dict(
            root=root,
            run=run,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            block_size=block_size,
            # kfp.local cannot pass an unset (None) parameter on: -1 stands for it
            dropout=None if dropout == -1 else dropout,
            batch_size=batch_size,
            max_iters=max_iters,
            time_budget=time_budget,
            learning_rate=learning_rate,
            warmup_iters=None if warmup_iters == -1 else warmup_iters,
            eval_interval=eval_interval,
            eval_iters=eval_iters,
            log_interval=log_interval,
            ckpt_interval=ckpt_interval,
            seed=seed,
            export_uri=export_uri or None,  # unset: no copy (a shorter command line)
        ),
        placement,
        backend=backend,
        image=workload_image,
        namespace=namespace,
        storage_secret=storage_secret,
    )
    for name, value in train_metrics(files).items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(train_report_html(run, files))
    return run
