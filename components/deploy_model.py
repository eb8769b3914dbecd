"""KFP component `deploy-model`: serve train-gpt's model with KServe, after train-gpt.

Not a stage (gpt/stages.py): it creates no TrainJob. The pipeline adds it when `serve` is set
(pipeline/pipeline.py); what it does is components/step/deployment.py.
"""

from kfp import dsl
from kfp.dsl import Markdown, Output

from components.step.image_names import component_image
from components.step.parameter_docs import documented


@dsl.component(base_image=component_image(), install_kfp_package=False)
# Its knobs are train-gpt's run and export (what it serves) and Serving's (how): their texts.
@documented("train-gpt")
def deploy_model(
    usage: Output[Markdown],
    run: str,
    block_size: int = 64,
    export_uri: str = "",
    serve: str = "",
    serve_timeout: float = 900,
    serve_gpus: int = 0,
    serve_service_account: str = "",
    backend: str = "trainjob",
    namespace: str = "",
) -> str:
    """Serve the run's model with a KServe InferenceService, wait until it is Ready and check it
    answers a completion.

    Args:
        usage: What serves the run's model, its answer, and a copy-pasteable curl and openai
            call against it.

    Returns:
        The InferenceService's OpenAI API at its cluster address
        (http://<name>-predictor.<namespace>.svc.cluster.local/openai/v1).
    """
    # Every parameter above by name, less the output: Serving's knobs, then what deploy() takes.
    knobs = dict(locals())
    del knobs["usage"]
    from components.step.deployment import Serving, deploy, usage_markdown

    deployed = deploy(Serving.take(knobs), **knobs)
    with open(usage.path, "w") as f:
        f.write(usage_markdown(run, deployed))
    return deployed.endpoint.base_url
