"""KFP component `train-gpt`: train the GPT, PyTorch DDP across nodes and processes."""

from kfp import dsl
from kfp.dsl import HTML, Metrics, Output

from components.images import component_image


@dsl.component(base_image=component_image(), install_kfp_package=False)
def train_gpt(
    metrics: Output[Metrics],
    report: Output[HTML],
    run: str,
    n_layer: int = 4,
    n_head: int = 4,
    n_embd: int = 128,
    block_size: int = 64,
    dropout: float = 0.2,
    batch_size: int = 12,
    max_iters: int = 600,
    time_budget: float = 120.0,
    learning_rate: float = 1e-3,
    warmup_iters: int = 100,
    eval_interval: int = 250,
    eval_iters: int = 200,
    log_interval: int = 10,
    seed: int = 1337,
    num_nodes: int = 1,
    num_proc_per_node: int = 1,
    gpus_per_node: int = 0,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "training",
    timeout: float = 86400,
) -> str:
    """Run `torchrun -m gpt -- train` (in a TrainJob on runtime gpt-train, or locally).

    Args:
        run: Run directory name under root (load-corpus returns it).
        n_layer: Transformer blocks.
        n_head: Attention heads per block.
        n_embd: Embedding width.
        block_size: Context length in tokens.
        dropout: Dropout probability.
        batch_size: Sequences per optimizer step, over all processes.
        max_iters: Optimizer steps at most.
        time_budget: Seconds of training at most (0: no limit).
        learning_rate: Peak learning rate.
        warmup_iters: Steps of linear learning-rate warmup (fewer than max_iters).
        eval_interval: Steps between validation evaluations.
        eval_iters: Validation batches per evaluation, at most.
        log_interval: Steps between metrics lines.
        seed: Seed of initialization and batch order.
        num_nodes: Training nodes (TrainJob numNodes; trainjob backend only).
        num_proc_per_node: Processes per node (TrainJob numProcPerNode; torchrun when > 1).
        gpus_per_node: NVIDIA GPUs to request per node (TrainJob resourcesPerNode); 0: none.
        root: Directory of run directories: /gpt (the PVC) for trainjob, any folder for local.
        backend: trainjob (a Kubeflow Trainer TrainJob) or local (a process here).
        workload_image: Image the TrainJob runs (the pipeline sets it from images.env).
        namespace: Namespace of the TrainJob.
        timeout: Seconds before the TrainJob is deleted and the step fails.

    Returns:
        The run directory name, for the next stage.
    """
    from components.artifacts import train_metrics, train_report_html
    from components.stages import run_stage

    if gpus_per_node < 0:
        raise ValueError(f"gpus_per_node {gpus_per_node}: must be >= 0")
    files = run_stage(
        "train",
        dict(
            root=root,
            run=run,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            block_size=block_size,
            dropout=dropout,
            batch_size=batch_size,
            max_iters=max_iters,
            time_budget=time_budget,
            learning_rate=learning_rate,
            warmup_iters=warmup_iters,
            eval_interval=eval_interval,
            eval_iters=eval_iters,
            log_interval=log_interval,
            seed=seed,
        ),
        backend=backend,
        image=workload_image,
        namespace=namespace,
        num_nodes=num_nodes,
        num_proc_per_node=num_proc_per_node,
        resources_per_node={"limits": {"nvidia.com/gpu": gpus_per_node}} if gpus_per_node else None,
        timeout=timeout,
    )
    for name, value in train_metrics(files).items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(train_report_html(run, files))
    return run
