"""One call to a served model's OpenAI completions endpoint, and the calls a person makes.

KServe's Hugging Face server (kserve/kserve v0.20.0 `python/huggingfaceserver`) serves OpenAI's
API under `/openai/v1`, the model named `--model_name`, which the runtime sets to the
InferenceService's name (`config/runtimes/kserve-huggingfaceserver.yaml`: `{{.Name}}`).
`transformers serve` (make serve) serves it under `/v1`, the model named by its folder. The
step's check is the answer's `model` and a non-empty text: a completion of this run's model.
"""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from dataclasses import dataclass

from components.serving.inferenceservice import ServingError

# What the step asks: a word every English text has, greedy, a few tokens.
PROBE_PROMPT = "The"
PROBE_TOKENS = 16
# A CPU server's first completion of a small model takes seconds; one unanswered this long is
# not coming.
CALL_TIMEOUT_S = 120.0


def probe_tokens(context: int) -> int:
    """How many tokens the probe asks of a model of `context` positions: the server refuses a
    prompt and completion longer than its context ("This model's maximum context length is
    ..."), and the prompt is at most a token a character."""
    return max(1, min(PROBE_TOKENS, context - len(PROBE_PROMPT)))


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible completions API and the model name it serves the run's model as."""

    base_url: str
    """Up to and including the API's version, e.g. http://gpt-r-predictor.ns.svc.cluster.local/openai/v1."""
    model: str


def complete(endpoint: Endpoint, prompt: str = PROBE_PROMPT, max_tokens: int = PROBE_TOKENS,
             who: str = "the server") -> str:  # fmt: skip
    """POST one greedy completion; the text. Raises ServingError (one line, naming `who`)
    unless the answer is a non-empty completion of `endpoint.model`."""
    url = f"{endpoint.base_url}/completions"
    body = json.dumps({"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()  # fmt: skip
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        # An opener of its own: the proxy settings (http_proxy, no_proxy) as they are now, not
        # as urlopen's shared opener took them at its first call.
        with urllib.request.build_opener().open(request, timeout=CALL_TIMEOUT_S) as answer:
            reply = json.loads(answer.read())
    except urllib.error.HTTPError as e:
        said = " ".join(e.read().decode(errors="replace").split())[:300]
        raise ServingError(f"{who}: {url} answered HTTP {e.code}: {said or e.reason}") from None
    except (OSError, ValueError) as e:  # no connection, a timeout, an answer that is no JSON
        raise ServingError(f"{who}: {url} gave no completion: {' '.join(str(e).split())}; the "
                           "step's pod must reach the cluster address (a NetworkPolicy or "
                           "Istio's mTLS may stop it)") from None  # fmt: skip
    if reply.get("model") != endpoint.model:
        raise ServingError(f"{who}: {url} answered for model {reply.get('model')!r}, not "
                           f"{endpoint.model!r}")  # fmt: skip
    text = ((reply.get("choices") or [{}])[0]).get("text") or ""
    if not text:
        raise ServingError(f"{who}: {url} answered an empty completion for {prompt!r}")
    return text


def curl_call(endpoint: Endpoint, prompt: str = PROBE_PROMPT,
              max_tokens: int = PROBE_TOKENS) -> str:  # fmt: skip
    """The completion as a copy-pasteable curl command."""
    body = json.dumps({"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0})  # fmt: skip
    return (f"curl {endpoint.base_url}/completions -H 'content-type: application/json' \\\n"
            f"    -d {shlex.quote(body)}")  # fmt: skip


def openai_call(endpoint: Endpoint, prompt: str = PROBE_PROMPT,
                max_tokens: int = PROBE_TOKENS) -> str:  # fmt: skip
    """The completion with the `openai` client, as a copy-pasteable Python program."""
    return (
        "from openai import OpenAI\n"
        f"client = OpenAI(base_url={endpoint.base_url!r}, api_key=\"unused\")\n"
        f"answer = client.completions.create(model={endpoint.model!r}, prompt={prompt!r},\n"
        f"                                   max_tokens={max_tokens}, temperature=0)\n"
        "print(answer.choices[0].text)\n"
    )
