"""train-gpt's model in Kubeflow's Model Registry (components/step/registration.py): the entry a
run makes, its requests held to the registry's OpenAPI spec by Prism (tests/support/registry.py),
two runs as two versions of one model, and a registry that refuses or is not there as one line.
The compiled pipeline registering through kfp.local: tests/kfp_pipeline/test_pipeline.py."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.registry import API

from components.step.dispatch import StepResult
from components.step.registration import (
    ModelEntry,
    Registration,
    RegistrationError,
    model_uri,
    register,
    register_run,
    run_metadata,
)
from gpt.rundir.layout import RunDir

CONFIG = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
          "max_position_embeddings": 64, "vocab_size": 4414}  # fmt: skip
TRAIN = [{"step": 10, "loss": 6.9}, {"step": 20, "loss": 6.5, "val_loss": 6.6, "val_bpb": 3.372}]


def carried(tmp_path: Path, *, init_from: dict | None = None) -> dict[str, bytes]:
    """A finished run's carried files, its report.md written by train-gpt's own writer."""
    from gpt.training import report

    rundir = RunDir.of(tmp_path, "r")
    rundir.train_jsonl.parent.mkdir(parents=True)
    rundir.train_jsonl.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    report.write(rundir, report.Summary(
        model="0.17M parameters: 2 layers x 2 heads x 32 wide, context 64, vocab 4414",
        data="gpt2 tokenizer, vocab 4414, 25,648 train / 3,002 validation tokens",
        training="20 steps", val_loss=6.6, val_bpb=3.372, command="python -m gpt train-gpt"))
    files = {out.rel: (rundir.path / out.rel).read_bytes()
             for out in (RunDir.train_jsonl, RunDir.report_md)}  # fmt: skip
    files[RunDir.model_config.rel] = json.dumps(CONFIG).encode()
    if init_from:
        files[RunDir.init_from_json.rel] = json.dumps(init_from).encode()
    return files


def test_the_entry_says_what_the_run_was(tmp_path):
    source = {"init_from": "hf://openai-community/gpt2", "revision": "607a30d",
              "weights_sha256": "5913e8"}  # fmt: skip
    assert run_metadata(carried(tmp_path, init_from=source), "kfp-run-1") == {
        "architecture": "GPTNeoXForCausalLM", "model_type": "gpt_neox", "context": 64,
        "vocab_size": 4414, "parameters": "0.17M", "tokenizer": "gpt2",
        "val_bits_per_byte": 3.372, "init_from": "hf://openai-community/gpt2",
        "init_from_revision": "607a30d", "init_from_weights_sha256": "5913e8",
        "kfp_run": "kfp-run-1",
    }  # fmt: skip


def test_the_uri_is_the_export_else_the_runs_model_directory(tmp_path):
    assert model_uri("r1", export_uri="s3://b/models/r1", backend="trainjob",
                     root="/gpt") == "s3://b/models/r1"  # fmt: skip
    assert model_uri("r1", export_uri="", backend="trainjob", root="/gpt") == (
        "pvc://gpt-pvc/r1/model")  # KServe's storageUri for a claim's path
    assert model_uri("r1", export_uri="", backend="local", root=str(tmp_path)) == (
        (tmp_path / "r1" / "model").as_uri())


def test_registration_knobs_leave_the_stages_flags():
    knobs = {"run": "r", "max_iters": 5, "model_registry": "http://mr:8080", "model_name": "m"}
    assert Registration.take(knobs) == Registration("http://mr:8080", "m")
    assert knobs == {"run": "r", "max_iters": 5}


@pytest.fixture
def service_account_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token where the client looks in a KFP step's pod (KFP's KF_PIPELINES_SA_TOKEN_PATH):
    the spec's Bearer security wants one."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))


def entry(run: str, name: str = "shakespeare-gpt") -> ModelEntry:
    return ModelEntry(name=name, version=run, uri=f"pvc://gpt-pvc/{run}/model",
                      metadata={"architecture": "GPTNeoXForCausalLM", "context": 64,
                                "val_bits_per_byte": 3.372, "kfp_run": run},
                      kfp_run=run, namespace="team-a")  # fmt: skip


@pytest.mark.process
def test_two_runs_are_two_versions_of_one_model_and_every_request_meets_the_spec(
        model_registry, service_account_token):  # fmt: skip
    address, store, prism_log = model_registry
    before, logged = len(store.requests), len(prism_log.read_text())
    for run in ("run-1", "run-2"):
        said = register(address, entry(run))
        assert said == (f"model registry {address}: registered shakespeare-gpt version {run} "
                        f"(pvc://gpt-pvc/{run}/model)")  # fmt: skip
    # Prism answered every request (a request or an answer off the spec is an error the client
    # raises: `--errors`), and passed each on to the store, which kept them.
    assert store.requests[before:]
    assert "Request terminated with error" not in prism_log.read_text()[logged:]
    (model,) = [m for m in store.models.values() if m["name"] == "shakespeare-gpt"]
    versions = [v for v in store.versions.values() if v["registeredModelId"] == model["id"]]
    assert [v["name"] for v in versions] == ["run-1", "run-2"]
    for version in versions:
        run = version["name"]
        assert version["customProperties"] == {
            "architecture": {"metadataType": "MetadataStringValue",
                             "string_value": "GPTNeoXForCausalLM"},
            "context": {"metadataType": "MetadataIntValue", "int_value": "64"},
            "val_bits_per_byte": {"metadataType": "MetadataDoubleValue", "double_value": 3.372},
            "kfp_run": {"metadataType": "MetadataStringValue", "string_value": run},
        }  # fmt: skip
        (artifact,) = store.artifacts[version["id"]]
        assert artifact["artifactType"] == "model-artifact"
        assert artifact["uri"] == f"pvc://gpt-pvc/{run}/model"
        assert (artifact["modelFormatName"], artifact["modelFormatVersion"]) == ("huggingface", "1")
        assert {k: artifact[k] for k in ("modelSourceKind", "modelSourceClass",
                                         "modelSourceGroup", "modelSourceId")} == {
            "modelSourceKind": "kfp", "modelSourceClass": "pipelinerun",
            "modelSourceGroup": "team-a", "modelSourceId": run}  # fmt: skip
    # A retried step finds its version there and leaves it.
    created = len(store.versions)
    assert "already registered" in register(address, entry("run-2"))
    assert len(store.versions) == created


@pytest.mark.process
def test_the_component_registers_after_its_stage(model_registry, service_account_token, tmp_path,
                                                 monkeypatch):  # fmt: skip
    """register_run, as train-gpt's component calls it with the step's knobs, on a TrainJob's
    run: the version's URI is the claim's path, its model source the KFP run of the pod's label
    and the step's namespace."""
    address, store, _ = model_registry
    monkeypatch.setenv("GPT_KFP_RUN_ID", "0d5e3c1a")
    monkeypatch.setenv("GPT_STEP_NAMESPACE", "team-b")
    step = StepResult("my-run", carried(tmp_path))
    knobs = {"backend": "trainjob", "root": "/gpt", "namespace": "", "export_uri": ""}
    lines: list[str] = []
    made = register_run(Registration(address, "tiny-gpt"), step, knobs, say=lines.append)
    assert made.uri == "pvc://gpt-pvc/my-run/model" and made.version == "my-run"
    assert lines == [f"model registry {address}: registered tiny-gpt version my-run "
                     "(pvc://gpt-pvc/my-run/model)"]  # fmt: skip
    (version,) = [v for v in store.versions.values() if v["name"] == "my-run"]
    (artifact,) = store.artifacts[version["id"]]
    assert (artifact["modelSourceId"], artifact["modelSourceGroup"]) == ("0d5e3c1a", "team-b")
    assert version["customProperties"]["kfp_run"]["string_value"] == "0d5e3c1a"


def test_an_unreachable_registry_is_one_line_naming_it():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"http://127.0.0.1:{port}"
    with pytest.raises(RegistrationError) as err:
        register(address, entry("run-1"))
    assert str(err.value).startswith(f"model registry {address}: unreachable: Cannot connect")
    assert "\n" not in str(err.value)


def test_a_registry_that_never_answers_is_one_line_within_the_bound(monkeypatch):
    import components.step.registration as registration

    monkeypatch.setattr(registration, "CALL_TIMEOUT_S", 0.2)
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(RegistrationError) as err:
            register(address, entry("run-1"))
    assert str(err.value) == f"model registry {address}: unreachable: no answer within 0.2 s"


def test_a_bad_address_is_refused_before_the_stage_runs(tmp_path, monkeypatch):
    import components.step.dispatch as dispatch
    from components.train_gpt import train_gpt

    monkeypatch.setattr(dispatch, "run_step", lambda *a: pytest.fail("the stage ran"))
    with pytest.raises(ValueError, match=r"^model_registry 'mr:8080': not an http:// or "
                                         r"https:// address$"):  # fmt: skip
        train_gpt.python_func(metrics=None, report=None, model=None, run="r", backend="local",
                              root=str(tmp_path), model_registry="mr:8080")  # fmt: skip


@pytest.mark.process
def test_a_registry_that_refuses_is_one_line_with_its_reason(model_registry, monkeypatch):
    # No token where the pod would have one: the spec's Bearer security, which Prism enforces
    # as the registry's proxy does, answers 401.
    monkeypatch.delenv("KF_PIPELINES_SA_TOKEN_PATH", raising=False)
    address, store, _ = model_registry
    with pytest.raises(RegistrationError) as err:
        register(address, entry("run-refused"))
    assert str(err.value) == f"model registry {address}: refused (HTTP 401: Unauthorized)"
    assert not [v for v in store.versions.values() if v["name"] == "run-refused"]


@pytest.mark.process
def test_the_registry_refuses_what_the_spec_refuses(model_registry):
    """The control: what the tests above send reaches the store only because the spec admits
    it. A registered model in a state the spec has no name for is refused before the store."""
    address, store, _ = model_registry
    request = urllib.request.Request(
        f"{address}{API}/registered_models", method="POST",
        data=json.dumps({"name": "off-spec", "state": "RETIRED"}).encode(),
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 422
    assert json.loads(err.value.read())["validation"][0]["location"] == ["body", "state"]
    assert not [m for m in store.models.values() if m["name"] == "off-spec"]


class _Artifact:
    """What train_gpt writes its outputs to: a KFP artifact's path, metrics and metadata."""

    def __init__(self, path: Path):
        self.path, self.metadata, self.metrics = str(path), {}, {}

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name] = value


def test_the_component_registers_only_after_its_stage_and_fails_in_one_line(
        tmp_path, monkeypatch):  # fmt: skip
    """train_gpt's own body: the stage runs, its artifacts are made, then the registration,
    whose unreachable registry fails the step with its one line."""
    import components.step.dispatch as dispatch
    from components.train_gpt import train_gpt

    ran: list[dict] = []

    def stage_ran(name: str, knobs: dict) -> StepResult:  # the TrainJob, completed
        ran.append(knobs)
        return StepResult("r", carried(tmp_path))

    monkeypatch.setattr(dispatch, "run_step", stage_ran)
    metrics, report = _Artifact(tmp_path / "metrics"), _Artifact(tmp_path / "report.html")
    model = _Artifact(tmp_path / "model.json")
    with pytest.raises(RegistrationError, match=r"^model registry http://127\.0\.0\.1:1: "
                                                r"unreachable: Cannot connect"):  # fmt: skip
        train_gpt.python_func(metrics=metrics, report=report, model=model, run="r",
                              backend="local", root=str(tmp_path),
                              model_registry="http://127.0.0.1:1")  # fmt: skip
    assert len(ran) == 1 and "model_registry" not in ran[0]  # the stage had no such flag
    assert metrics.metrics["val_bits_per_byte"] == 3.372 and Path(report.path).is_file()
    assert model.metadata["model_uri"] == (tmp_path / "r" / "model").as_uri()


def test_prism_sees_the_vendored_spec_but_for_its_discriminators():
    """The one change Prism's copy of the spec has (support.registry.discriminated): a `oneOf`
    with a discriminator becomes the alternatives it maps, each bound to its value; the rest of
    the upstream spec is as vendored."""
    import yaml
    from support.registry import SPEC, discriminated

    def without_choices(node):
        if isinstance(node, list):
            return [without_choices(item) for item in node]
        if isinstance(node, dict):
            return {k: without_choices(v) for k, v in node.items()
                    if k not in ("oneOf", "discriminator")}  # fmt: skip
        return node

    upstream = yaml.safe_load(SPEC.read_text())
    seen = discriminated(upstream)
    assert without_choices(seen) == without_choices(upstream)
    schemas, originals = seen["components"]["schemas"], upstream["components"]["schemas"]
    chosen = {name: s["discriminator"] for name, s in originals.items() if "discriminator" in s}
    assert {"Artifact", "ArtifactCreate", "MetadataValue"} <= chosen.keys()
    for name, choice in chosen.items():
        prop = choice["propertyName"]
        assert [(a["allOf"][0]["$ref"], a["allOf"][1]["properties"][prop]["enum"])
                for a in schemas[name]["oneOf"]] == [
            (ref, [value]) for value, ref in choice["mapping"].items()]  # fmt: skip
