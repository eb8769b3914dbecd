"""The deploy step (components/step/deployment.py, components/deploy_model.py) on the test API
server with KServe v0.20.0's InferenceService CRD: the step applies, waits and asks; here a
thread plays KServe's controller by writing the statuses KServe writes (the CRD admits each) and
a local HTTP server answers as KServe's server does. Each way it fails is one line. (KServe's own
server behind a modelled controller: the test cluster's serving tests.)"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from support.apiserver import namespace

from components.serving.completion import PROBE_PROMPT, Endpoint, complete, probe_tokens
from components.serving.inferenceservice import GROUP, PLURAL, VERSION, ServingError
from components.step.deployment import Serving, deploy, refuse_local, usage_markdown

RUN = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"
NOW = "2026-11-28T16:00:00Z"


class OpenAI(http.server.BaseHTTPRequestHandler):
    """/openai/v1/completions as KServe's Hugging Face server answers it (OpenAI's
    CreateCompletionResponse); `answer` shapes it."""

    answer: dict = {}

    def do_POST(self):  # noqa: N802
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        code = self.answer.get("code", 200)
        reply = {"id": "cmpl-1", "object": "text_completion", "created": 0,
                 "model": self.answer.get("model", asked["model"]),
                 "choices": [{"index": 0, "text": self.answer.get("text", " ANTIPHOLUS"),
                              "finish_reason": "length", "logprobs": None}]}  # fmt: skip
        body = json.dumps(reply if code == 200 else {"error": "boom"}).encode()
        if self.path != "/openai/v1/completions":
            code, body = 404, b'{"detail": "Not Found"}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    """A local server answering as KServe's predictor; yields (its URL, its handler class)."""
    handler = type("Handler", (OpenAI,), {"answer": {}})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", handler
    httpd.shutdown()


def condition(kind: str, status: str, reason: str = "", message: str = "") -> dict:
    c = {"type": kind, "status": status, "lastTransitionTime": NOW}
    return {**c, **({"reason": reason} if reason else {}), **({"message": message} if message
                                                              else {})}  # fmt: skip


def ready(url: str) -> dict:
    """The status KServe v0.20.0 writes for a raw deployment that is up."""
    return {"conditions": [condition("IngressReady", "True"),
                           condition("PredictorReady", "True", "NewReplicaSetAvailable"),
                           condition("Ready", "True")],
            "url": url, "address": {"url": url},
            "modelStatus": {"transitionStatus": "UpToDate",
                            "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
                            "copies": {"failedCopies": 0, "totalCopies": 1}}}  # fmt: skip


LOADING = {"conditions": [
    condition("IngressReady", "True"),
    condition("PredictorReady", "False", "MinimumReplicasUnavailable",
              "Deployment does not have minimum availability."),
    condition("Ready", "False", "MinimumReplicasUnavailable",
              "Deployment does not have minimum availability.")],
    "modelStatus": {"transitionStatus": "InProgress",
                    "states": {"activeModelState": "", "targetModelState": "Pending"}}}  # fmt: skip
FAILED_LOAD = {**LOADING, "modelStatus": {
    "transitionStatus": "BlockedByFailedLoad",
    "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
    "lastFailureInfo": {"reason": "ModelLoadFailed", "exitCode": 1,
                        "message": "OSError: /mnt/models does not appear to have a file "
                                   "named config.json"}}}  # fmt: skip


class Kserve(threading.Thread):
    """Plays KServe's controller: once the step's InferenceService exists, writes `statuses`
    onto it one after another."""

    def __init__(self, api, ns: str, statuses: list[dict]):
        super().__init__(daemon=True)
        self.api, self.ns, self.statuses = api, ns, statuses
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            end = time.monotonic() + 30
            while time.monotonic() < end:
                items = self.api.list_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                               PLURAL)["items"]  # fmt: skip
                if items:
                    break
                time.sleep(0.05)  # the test's own poll, not the code under test's
            name = items[0]["metadata"]["name"]
            for status in self.statuses:
                time.sleep(0.1)
                self.api.patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.ns, PLURAL, name, {"status": status})
        except BaseException as e:  # surfaced by the test
            self.error = e


def test_the_step_serves_the_run_and_says_how_to_call_it(kserve_api, server):
    url, _ = server
    ns = namespace()
    kserve = Kserve(kserve_api, ns, [LOADING, ready(url)])
    lines: list[str] = []
    deployed = deploy(Serving("kserve", serve_timeout=30), RUN, export_uri="", namespace=ns,
                      backend="trainjob", api=kserve_api, say=lines.append)  # fmt: skip
    kserve.join(5)
    assert kserve.error is None
    name = f"gpt-{RUN}"
    assert (deployed.name, deployed.namespace) == (name, ns)
    assert deployed.storage_uri == f"pvc://gpt-pvc/{RUN}/model"
    assert deployed.endpoint == Endpoint(f"{url}/openai/v1", name)
    assert deployed.reply == " ANTIPHOLUS"
    assert lines[0].startswith(f"applied InferenceService {ns}/{name} (generation 1, pvc://")
    assert (f"InferenceService {ns}/{name}: PredictorReady False: MinimumReplicasUnavailable: "
            "Deployment does not have minimum availability.; model Pending") in lines
    assert lines[-1].startswith(f"InferenceService {ns}/{name} answered 'The' -> ' ANTIPHOLUS'")
    text = usage_markdown(RUN, deployed)
    assert f"curl {url}/openai/v1/completions -H 'content-type: application/json'" in text
    assert f'"model": "{name}"' in text and f"base_url='{url}/openai/v1'" in text
    assert f"kubectl -n {ns} port-forward service/{name}-predictor 8080:80" in text


def test_a_model_that_does_not_load_fails_the_step_with_kserves_reason(kserve_api):
    ns = namespace()
    Kserve(kserve_api, ns, [LOADING, FAILED_LOAD])
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=30), "r1", export_uri="s3://models/r1",
               namespace=ns, backend="trainjob", api=kserve_api, say=lambda _: None)
    assert str(err.value) == (
        f"InferenceService {ns}/gpt-r1: the predictor failed: BlockedByFailedLoad: "
        "ModelLoadFailed: OSError: /mnt/models does not appear to have a file named "
        "config.json (exit code 1); its logs: kubectl -n " + ns + " logs -l "
        "serving.kserve.io/inferenceservice=gpt-r1 -c storage-initializer (the model's "
        "download) or -c kserve-container (the server); it is left in place")
    # nothing deleted
    assert kserve_api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gpt-r1")


def test_a_predictor_that_gave_up_fails_at_once(kserve_api):
    gave_up = {**LOADING, "conditions": [
        condition("PredictorReady", "False", "ProgressDeadlineExceeded",
                  'ReplicaSet "gpt-r2-predictor-5d8f" has timed out progressing.'),
        condition("Ready", "False", "ProgressDeadlineExceeded")]}  # fmt: skip
    ns = namespace()
    Kserve(kserve_api, ns, [gave_up])
    with pytest.raises(ServingError, match=r": the predictor failed: PredictorReady False: "
                                           r"ProgressDeadlineExceeded: ReplicaSet "):
        deploy(Serving("kserve", serve_timeout=30), "r2", export_uri="", namespace=ns,
               backend="trainjob", api=kserve_api, say=lambda _: None)


def test_not_ready_by_the_deadline_is_one_line_saying_where_to_look(kserve_api):
    ns = namespace()
    Kserve(kserve_api, ns, [LOADING])
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=1), "r3", export_uri="", namespace=ns,
               backend="trainjob", api=kserve_api, say=lambda _: None)
    assert str(err.value) == (
        f"InferenceService {ns}/gpt-r3: not Ready within 1 s: PredictorReady False: "
        "MinimumReplicasUnavailable: Deployment does not have minimum availability.; model "
        f"Pending; kubectl -n {ns} describe pods -l serving.kserve.io/inferenceservice=gpt-r3 "
        "says why (an image that does not pull, no node with room, a server that keeps "
        f"exiting: then kubectl -n {ns} logs -l serving.kserve.io/inferenceservice=gpt-r3 -c "
        "kserve-container), or raise serve_timeout; it is left in place")


def test_no_controller_is_said_at_the_deadline(kserve_api):
    ns = namespace()
    lines: list[str] = []
    with pytest.raises(ServingError) as err:
        deploy(Serving("kserve", serve_timeout=0.5), "r4", export_uri="", namespace=ns,
               backend="trainjob", api=kserve_api, say=lines.append)
    assert lines[1] == (f"InferenceService {ns}/gpt-r4: no status yet: KServe's controller has "
                        "not reconciled it")
    assert str(err.value) == (
        f"InferenceService {ns}/gpt-r4: not Ready within 0.5 s: KServe's controller never "
        "reconciled it: is it running? kubectl get pods -A -l "
        "control-plane=kserve-controller-manager; it is left in place")


@pytest.mark.parametrize("answer,said", [
    ({"model": "another"}, "answered for model 'another', not 'gpt-r'"),
    ({"text": ""}, "answered an empty completion for 'The'"),
    ({"code": 500}, 'answered HTTP 500: {"error": "boom"}'),
])  # fmt: skip
def test_an_answer_that_is_not_the_runs_model_fails_the_check(server, answer, said):
    url, handler = server
    handler.answer = answer
    with pytest.raises(ServingError) as err:
        complete(Endpoint(f"{url}/openai/v1", "gpt-r"), who="InferenceService ns/gpt-r")
    assert str(err.value) == (f"InferenceService ns/gpt-r: {url}/openai/v1/completions {said}")


def test_the_probe_is_greedy_and_short(server):
    url, _ = server
    assert complete(Endpoint(f"{url}/openai/v1", "m")) == " ANTIPHOLUS"
    assert PROBE_PROMPT == "The"


def test_the_probe_asks_no_more_than_the_models_context_holds():
    # KServe's server refuses a prompt and completion longer than the model's context: "This
    # model's maximum context length is 16 tokens. However, you requested 19 tokens (3 in the
    # messages, 16 in the completion)" (a run of block_size 16, with h-kserve's cluster).
    assert [probe_tokens(n) for n in (64, 19, 16, 4, 1)] == [16, 16, 13, 1, 1]


@pytest.mark.parametrize("knobs,message", [
    ({"serve": "kserv"}, "serve 'kserv': must be empty (no deploy step) or kserve"),
    ({"serve_timeout": 0}, "serve_timeout 0: must be a positive number of seconds"),
    ({"serve_gpus": -1}, "serve_gpus -1: must be >= 0"),
    ({"serve_service_account": "Bad_SA"}, "serve_service_account 'Bad_SA': not a valid"),
])  # fmt: skip
def test_bad_serving_knobs_are_refused_before_anything(knobs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Serving(**knobs)


def test_the_local_backend_refuses_serve():
    with pytest.raises(ValueError, match=r"^serve 'kserve': the local backend has no KServe; "
                                         r"serve the model on this machine with `make serve`$"):
        refuse_local("kserve", "local")
    refuse_local("", "local")
    refuse_local("kserve", "trainjob")


def test_the_component_refuses_a_typo_and_the_local_backend_in_one_line():
    from components.deploy_model import deploy_model

    with pytest.raises(ValueError, match=r"^serve 'ksrve': must be empty"):
        deploy_model.python_func(usage=None, run="r", serve="ksrve")
    with pytest.raises(ValueError, match=r"^serve 'kserve': the local backend has no KServe"):
        deploy_model.python_func(usage=None, run="r", serve="kserve", backend="local")


@pytest.mark.process
# kfp.local warns that the step's image is not this Python; running it here is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_component_through_kfp_local_outputs_the_address_and_the_calls(
        kserve_api, kubeconfig_env, server, tmp_path, monkeypatch):  # fmt: skip
    """deploy-model as KFP runs it (kfp.local's SubprocessRunner: the component's own source in
    a process of its own, its outputs as KFP's executor writes them)."""
    from kfp import local

    from components.deploy_model import deploy_model

    url, _ = server
    ns = namespace()
    monkeypatch.setenv("GPT_STEP_NAMESPACE", ns)  # the compiled pipeline's downward API
    Kserve(kserve_api, ns, [LOADING, ready(url)])
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
    task = deploy_model(run=RUN, serve="kserve", serve_timeout=60.0)
    assert task.outputs["Output"] == f"{url}/openai/v1"
    usage = open(task.outputs["usage"].path).read()
    assert usage.startswith(f"# deploy-model: run `{RUN}`\n\nInferenceService `gpt-{RUN}` in "
                            f"namespace `{ns}` serves the run's model (`pvc://gpt-pvc/{RUN}/model`)")
    assert f"curl {url}/openai/v1/completions" in usage


def test_a_reply_with_backticks_stays_inside_its_code_block():
    from components.step.deployment import Deployed

    deployed = Deployed("gpt-r", "ns", "pvc://gpt-pvc/r/model",
                        Endpoint("http://gpt-r-predictor.ns.svc.cluster.local/openai/v1", "gpt-r"),
                        "```\n# not a heading", 16, 1.0)  # fmt: skip
    text = usage_markdown("r", deployed)
    assert "\n````text\n```\n# not a heading\n````\n" in text
