"""KFP component `generative-prompt`: talk to the trained model (kubectl attach, or one-shot)."""

from kfp import dsl
from kfp.dsl import Markdown, Output

from components.step.image_names import component_image
from components.step.parameter_docs import documented


@dsl.component(base_image=component_image(), install_kfp_package=False)
# @documented (components/step/parameter_docs.py) appends to __doc__'s Args: one line per parameter
# it does not describe, its knob's field docstring; @dsl.component then reads the texts.
@documented("generative-prompt")
def generative_prompt(
    transcript: Output[Markdown],
    run: str,
    prompt: list = [],  # noqa: B006  (KFP reads the default from the signature; never mutated)
    system: str = "",
    web_port: int = 0,
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
    `kubectl -n <namespace> attach -it <pod> -c node` command (with `web_port`, the
    `kubectl port-forward` command that reaches its chat page). With prompts: answers, then
    ends.
    Every parameter but the output is a knob: its text is its field's docstring
    (components/step/parameter_docs.py).

    Args:
        transcript: prompt/transcript.jsonl as Markdown, one section per reply.
    """
    # Every parameter above by name, as locals() holds nothing else yet; less the output
    # artifact (deleted next), the step's knobs. run_step (components/step/dispatch.py) sorts
    # them into the stage's flags, its Placement and its StepKnobs (sort_knobs), checks the
    # flags with the stage's config (validate) and hands them to the stage as `--name value`.
    # Not written out name by name: that would be a second copy of the signature.
    knobs = dict(locals())
    del knobs["transcript"]
    from components.step.artifacts import transcript_markdown
    from components.step.dispatch import run_step
    from components.trainjob.attach import attach_hint

    interactive = backend == "trainjob" and not prompt
    step = run_step("generative-prompt", knobs,
                    on_update=attach_hint(web_port=web_port) if interactive else None)
    with open(transcript.path, "w") as f:
        f.write(transcript_markdown(step.run_id, step.files))
