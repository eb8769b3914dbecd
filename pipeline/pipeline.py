"""`gpt_trainjobs_pipeline`: load-corpus -> train-gpt -> generative-prompt.

Each step creates a Kubeflow Trainer TrainJob (backend="trainjob") or runs the stage as a local
process (backend="local"); the stages share the run directory `<root>/<run>/`, whose name each
step hands the next. Parameters carry the CLI's names (one name per knob) and its defaults, except
where the pipeline chooses otherwise (block_size: one value for corpus and training alike).
"""

from kfp import dsl, kubernetes

from components.generative_prompt import generative_prompt
from components.load_corpus import load_corpus
from components.step.context import NAMESPACE_ENV, RUN_ID_ENV, RUN_ID_LABEL
from components.step.image_names import workload_image as images_env_workload_image
from components.train_gpt import train_gpt

NAME = "gpt-trainjobs"


@dsl.pipeline(
    name=NAME,
    description="Train a GPT from scratch with Kubeflow Trainer TrainJobs, then talk to it.",
)
def gpt_trainjobs_pipeline(
    # the corpus
    source: str = "default",
    tokenizer: str = "gpt2",
    compact: bool = True,
    max_vocab: int = 8192,
    val_fraction: float = 0.1,
    # the model
    n_layer: int = 4,
    n_head: int = 4,
    n_embd: int = 128,
    block_size: int = 64,
    dropout: float = -1.0,
    # training: length, scale-out
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
    num_nodes: int = 1,
    num_proc_per_node: int = 0,
    gpus_per_node: int = 0,
    train_timeout: float = 86400,
    export_uri: str = "",
    # the prompt
    prompt: list = [],  # noqa: B006  (read by the compiler; never mutated)
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 0,
    top_p: float = 1.0,
    idle_timeout: float = 600,
    prompt_timeout: float = 3600,
    # where it runs
    start_timeout: float = 120,
    backend: str = "trainjob",
    namespace: str = "",
    storage_secret: str = "",
    root: str = "/gpt",
    run: str = "",
    # fixed when the pipeline compiles (images.env, or IMAGE_REGISTRY/IMAGE_TAG); a run may
    # override it, e.g. with a CUDA build
    workload_image: str = images_env_workload_image(),
):
    """load-corpus -> train-gpt -> generative-prompt.

    Args:
        source: Text to train on: URL, file or directory of .txt, s3:// or gs:// object or
            prefix/ (its .txt objects), or 'default' (embedded).
        tokenizer: gpt2 or char.
        compact: gpt2 only: keep just the tokens the corpus uses.
        max_vocab: gpt2 compacted: at most this many tokens, the most frequent; 0: no limit.
        val_fraction: Fraction of the text held out for validation.
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
        seed: Seed of training and of the first reply's sampling.
        num_nodes: Training nodes (TrainJob numNodes).
        num_proc_per_node: Training processes per node (TrainJob numProcPerNode); 0: one per
            GPU (gpus_per_node), else 1.
        gpus_per_node: NVIDIA GPUs per training node; 0: CPU.
        train_timeout: Seconds before the training TrainJob is deleted and the run fails.
        export_uri: Also copy the finished model/ to this s3:// or gs:// prefix (e.g. for
            KServe's storageUri), its manifest gpt-export.json last; empty: no copy.
        prompt: Prompts to answer one-shot; empty: an interactive session (kubectl attach).
        max_new_tokens: Most tokens per reply.
        temperature: Softmax temperature; 0 is greedy.
        top_k: Sample among the k most likely tokens; 0: no limit.
        top_p: Nucleus sampling threshold in (0, 1].
        idle_timeout: The interactive session ends after this many idle seconds; 0: never.
        prompt_timeout: Seconds before the prompt TrainJob is deleted (keep it above idle_timeout).
        start_timeout: Seconds a step's TrainJob may go without a pod, and each of its pods
            may stay Pending (unschedulable, image not pulled), before the step fails with the
            reason; raise it where pulling the workload image takes longer.
        backend: trainjob (Kubeflow Trainer TrainJobs) or local (processes on this machine).
        namespace: Namespace of the TrainJobs and PVC gpt-pvc; empty: the steps' own (kubeflow on
            standalone KFP, the profile namespace on multi-user Kubeflow).
        storage_secret: Secret in that namespace with the object-store credentials
            (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_ENDPOINT_URL, AWS_REGION)
            that load-corpus and train-gpt take by reference; empty: none (no object storage,
            or IRSA / Workload Identity).
        root: Directory of run directories: /gpt (the PVC) for trainjob, a folder for local.
        run: Run directory name; empty: the KFP run id.
        workload_image: Image the TrainJobs run (the gpt package and PyTorch).
    """
    common = dict(root=root, backend=backend, namespace=namespace, workload_image=workload_image,
                  start_timeout=start_timeout)  # fmt: skip
    corpus = load_corpus(
        run=run,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        source=source,
        tokenizer=tokenizer,
        compact=compact,
        max_vocab=max_vocab,
        val_fraction=val_fraction,
        block_size=block_size,
        storage_secret=storage_secret,
        **common,
    )
    train = train_gpt(
        run=corpus.outputs["Output"],
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
        ckpt_interval=ckpt_interval,
        seed=seed,
        num_nodes=num_nodes,
        num_proc_per_node=num_proc_per_node,
        gpus_per_node=gpus_per_node,
        export_uri=export_uri,
        timeout=train_timeout,
        storage_secret=storage_secret,
        **common,
    )
    chat = generative_prompt(
        run=train.outputs["Output"],
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        idle_timeout=idle_timeout,
        timeout=prompt_timeout,
        **common,
    )
    for task in (corpus, train, chat):
        # Every step creates a TrainJob and writes the PVC: a cached step would skip both.
        task.set_caching_options(False)
        # The step's own namespace, and its run id where a KFP backend before 2.5 leaves
        # PIPELINE_JOB_ID_PLACEHOLDER unresolved: from its pod, through the downward API.
        kubernetes.use_field_path_as_env(task, NAMESPACE_ENV, "metadata.namespace")
        kubernetes.use_field_path_as_env(task, RUN_ID_ENV, f"metadata.labels['{RUN_ID_LABEL}']")
