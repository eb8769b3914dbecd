"""KFP component `generative-prompt`: talk to the trained model (kubectl attach, or one-shot)."""

from kfp import dsl
from kfp.dsl import Markdown, Output

from components.step.image_names import component_image


@dsl.component(base_image=component_image(), install_kfp_package=False)
def generative_prompt(
    transcript: Output[Markdown],
    run: str,
    prompt: list = [],  # noqa: B006  (KFP reads the default from the signature; never mutated)
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 1337,
    idle_timeout: float = 600,
    root: str = "/gpt",
    backend: str = "trainjob",
    workload_image: str = "",
    namespace: str = "",
    timeout: float = 3600,
    start_timeout: float = 120,
):
    """Run `python -m gpt generative-prompt` (in a TrainJob on runtime gpt-generative-prompt, or
    locally).

    With no `prompt`, the TrainJob's pod waits for a person: this step's log prints the exact
    `kubectl -n <namespace> attach -it <pod> -c node` command. With prompts: answers, then ends.

    Args:
        run: Run directory name under root (train-gpt returns it).
        prompt: Prompts to answer, one-shot; empty: interactive session.
        max_new_tokens: Most tokens generated per reply.
        temperature: Softmax temperature; 0 is greedy.
        top_k: Sample among the k most likely tokens; 0: no limit.
        top_p: Nucleus sampling threshold in (0, 1]; 1 keeps all.
        seed: Seed of the first reply's sampling.
        idle_timeout: Interactive session ends after this many seconds without input; 0: never.
        root: Directory of run directories: /gpt (the PVC) for trainjob, any folder for local.
        backend: trainjob (a Kubeflow Trainer TrainJob) or local (a process here; stdin closed).
        workload_image: Image the TrainJob runs (the pipeline sets it from images.env).
        namespace: Namespace of the TrainJob; empty: the step's own (its pod's namespace).
        timeout: Seconds before the TrainJob is deleted and the step fails (keep it above
            idle_timeout).
        start_timeout: Seconds a TrainJob may go without a pod, and each pod may stay Pending
            (unschedulable, image not pulled), before the step fails with the reason.
    """
    from components.step.artifacts import transcript_markdown
    from components.step.dispatch import run_stage
    from components.trainjob.attach import attach_hint
    from components.trainjob.placement import Placement

    interactive = backend == "trainjob" and not prompt
    files = run_stage(
        "generative-prompt",
        dict(
            root=root,
            run=run,
            prompt=list(prompt),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            # 0 is "unset" here: the CLI leaves these out for no limit / no idle timeout.
            top_k=top_k or None,
            top_p=top_p,
            seed=seed,
            idle_timeout=idle_timeout or None,
        ),
        Placement(timeout=timeout, start_timeout=start_timeout),
        backend=backend,
        image=workload_image,
        namespace=namespace,
        on_update=attach_hint() if interactive else None,
    )
    with open(transcript.path, "w") as f:
        f.write(transcript_markdown(run, files))
