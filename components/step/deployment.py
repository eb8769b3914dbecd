"""The deploy step's work: the run's model behind KServe, Ready, answering a completion.

A step after train-gpt, not a stage: it creates no TrainJob and runs no `python -m gpt`. It
server-side applies the run's InferenceService (components/serving/inferenceservice.py) in the
step's namespace, waits for it to be Ready within `serve_timeout` (components/serving/
readiness.py), then asks its cluster address for one completion (components/serving/
completion.py) and checks that the run's model answered. Every failure is one line,
`ServingError`, and deletes nothing: the InferenceService stays for a look (and a re-run applies
the same one again).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from components.serving.completion import (
    PROBE_PROMPT,
    Endpoint,
    complete,
    curl_call,
    openai_call,
    probe_tokens,
)
from components.serving.inferenceservice import (
    GROUP,
    Predictor,
    api_refusal,
    build_inferenceservice,
    server_side_apply,
    service_name,
)
from components.serving.readiness import address, wait_ready
from components.step import context
from components.step.artifacts import code_fence
from components.step.registration import model_uri

SERVERS = ("kserve",)
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# KServe's Hugging Face server serves OpenAI's API under this path (huggingfaceserver, v0.20.0).
OPENAI_PATH = "/openai/v1"


@dataclass(frozen=True)
class Serving:
    """Whether and how the pipeline serves the run's model after train-gpt: the deploy step's
    own knobs."""

    serve: str = ""
    """kserve: after train-gpt, serve the run's model with a KServe InferenceService (Hugging
    Face runtime, OpenAI API) in the steps' namespace, check it answers, and output its
    address; empty: no deploy step."""
    serve_timeout: float = 900
    """Seconds the deploy step waits for the InferenceService to be Ready (pulling the server's
    image, loading the model) before it fails; the InferenceService is left as it is. Keep it
    above 600: KServe reports a model that does not load once its Deployment's progress
    deadline (600 s) has passed."""
    serve_gpus: int = 0
    """NVIDIA GPUs for the InferenceService's predictor; 0: CPU, KServe's transformers backend
    (float32); more: the runtime's default backend, vLLM."""
    serve_service_account: str = ""
    """ServiceAccount the predictor runs as; for an s3:// export_uri, one that names the
    storage Secret (KServe's S3 convention: its keys AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY, the endpoint in its serving.kserve.io/s3-* annotations); empty: the
    namespace's default."""

    def __post_init__(self) -> None:
        if self.serve not in ("", *SERVERS):
            raise ValueError(f"serve {self.serve!r}: must be empty (no deploy step) or "
                             f"{' or '.join(SERVERS)}")  # fmt: skip
        if not self.serve_timeout > 0:
            raise ValueError(f"serve_timeout {self.serve_timeout}: must be a positive number "
                             "of seconds")  # fmt: skip
        if self.serve_gpus < 0:
            raise ValueError(f"serve_gpus {self.serve_gpus}: must be >= 0")
        account = self.serve_service_account
        if account and (not _SUBDOMAIN.match(account) or len(account) > 253):
            raise ValueError(f"serve_service_account {account!r}: not a valid Kubernetes "
                             "ServiceAccount name")  # fmt: skip

    @classmethod
    def take(cls, knobs: dict[str, Any]) -> Serving:
        """Remove this class's knobs from a component's `knobs` and return them."""
        return cls(**{f.name: knobs.pop(f.name) for f in fields(cls) if f.name in knobs})


def refuse_local(serve: str, backend: str) -> None:
    """The local backend has no KServe: refuse `serve` there in one line."""
    if serve and backend == "local":
        raise ValueError(f"serve {serve!r}: the local backend has no KServe; serve the model on "
                         "this machine with `make serve`")  # fmt: skip


@dataclass(frozen=True)
class Deployed:
    """An InferenceService that answered."""

    name: str
    namespace: str
    storage_uri: str
    endpoint: Endpoint
    """Its OpenAI API at the predictor's cluster address, and the model name it serves."""
    reply: str
    """Its answer to PROBE_PROMPT."""
    tokens: int
    """How many tokens the probe asked for (what the model's context leaves)."""
    seconds: float
    """From the apply to the answer."""


def deploy(serving: Serving, run: str, *, export_uri: str, namespace: str, backend: str,
           block_size: int = 64, api: Any = None,
           say: Callable[[str], None] = print) -> Deployed:  # fmt: skip
    """Serve run `run`'s model (its context `block_size`) in `namespace` (empty: the step's) and
    check its answer; raises ServingError (one line) when KServe is missing, RBAC forbids, the
    predictor fails, it is not Ready by `serving.serve_timeout`, or it answers wrongly."""
    if serving.serve not in SERVERS:
        raise ValueError(f"serve {serving.serve!r}: the deploy step needs serve=kserve")
    refuse_local(serving.serve, backend)
    namespace = context.namespace(namespace)
    name = service_name(run, namespace)
    uri = model_uri(run, export_uri=export_uri, backend=backend, root="")
    body = build_inferenceservice(name, namespace, run, Predictor(
        uri, gpus=serving.serve_gpus, service_account=serving.serve_service_account))
    if api is None:
        from kubernetes import client

        from components.trainjob.launcher import load_kube_config

        load_kube_config()
        api = client.CustomObjectsApi()
    where = f"{namespace}/{name}"
    start = time.monotonic()
    try:
        applied = server_side_apply(api, body)
    except Exception as e:  # the client's ApiException: 404 and 403 are one line each
        raise api_refusal(e, where) or e from None
    generation = applied["metadata"].get("generation")
    say(f"applied InferenceService {where} (generation {generation}, {uri}); follow it with: "
        f"kubectl -n {namespace} get inferenceservices.{GROUP} {name} -w")
    try:
        done = wait_ready(api, applied, serving.serve_timeout, say)
    except Exception as e:
        raise api_refusal(e, where) or e from None
    endpoint = Endpoint(address(done).rstrip("/") + OPENAI_PATH, name)
    tokens = probe_tokens(block_size)
    reply = complete(endpoint, max_tokens=tokens, who=f"InferenceService {where} is Ready, but")
    seconds = time.monotonic() - start
    say(f"InferenceService {where} answered {PROBE_PROMPT!r} -> {reply!r}, {seconds:.0f} s after "
        f"the apply; its OpenAI API: {endpoint.base_url}")
    return Deployed(name, namespace, uri, endpoint, reply, tokens, seconds)


def usage_markdown(run: str, deployed: Deployed) -> str:
    """The step's Markdown: what serves the run's model and the calls that reach it."""
    e, ns, name = deployed.endpoint, deployed.namespace, deployed.name
    local = Endpoint(f"http://localhost:8080{OPENAI_PATH}", name)
    fence = code_fence(deployed.reply)  # a reply is the model's text: any backticks in it
    return (
        f"# deploy-model: run `{run}`\n\n"
        f"InferenceService `{name}` in namespace `{ns}` serves the run's model "
        f"(`{deployed.storage_uri}`) with KServe's Hugging Face runtime, on OpenAI's "
        f"completions API at `{e.base_url}`. It answered `{PROBE_PROMPT}` with:\n\n"
        f"{fence}text\n{deployed.reply}\n{fence}\n\n"
        "## From a pod in the cluster\n\n"
        f"```bash\n{curl_call(e, max_tokens=deployed.tokens)}\n```\n\n"
        f"```python\n{openai_call(e, max_tokens=deployed.tokens)}```\n\n"
        "## From your machine\n\n"
        f"```bash\nkubectl -n {ns} port-forward service/{name}-predictor 8080:80\n"
        f"{curl_call(local, max_tokens=deployed.tokens)}\n```\n\n"
        f"Delete it when done: `kubectl -n {ns} delete inferenceservice {name}`.\n"
    )
