"""The pipeline: it compiles, the committed YAML is fresh (its parameters:
tests/kfp_components/step/test_parameter_docs.py), bad input stops a step before anything
starts, and the compiled pipeline runs end to end on this machine with kfp.local (every stage a
local process, the prompt one-shot)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from support.paths import PROJECT
from support.runs import TINY_PIPELINE

from components.generative_prompt import generative_prompt
from components.load_corpus import load_corpus
from components.step.image_names import workload_image
from components.train_gpt import train_gpt
from gpt.stages import STAGES
from pipeline.__main__ import COMPILED

STEPS = list(STAGES)


def compile_fresh(tmp_path: Path) -> Path:
    """Compile in a fresh interpreter, with images.env's names (not this shell's overrides)."""
    out = tmp_path / "pipeline.yaml"
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_REGISTRY", "IMAGE_TAG")}
    subprocess.run([sys.executable, "-m", "pipeline", "compile", "--output", str(out)],
                   cwd=PROJECT, env=env, check=True, capture_output=True)  # fmt: skip
    return out


@pytest.mark.process
def test_compiles_to_the_stages_as_chained_uncached_steps(tmp_path):
    spec, platform = yaml.safe_load_all(compile_fresh(tmp_path).read_text())
    tasks = spec["root"]["dag"]["tasks"]
    assert sorted(tasks) == sorted([*STEPS, "condition-1"])  # the deploy step's: below
    # The run directory's name flows from step to step (a data dependency, not just an order).
    for before, t in zip(STEPS, STEPS[1:], strict=False):
        assert tasks[t]["inputs"]["parameters"]["run"]["taskOutputParameter"] == {
            "producerTask": before, "outputParameterKey": "Output"}, t
    corpus_id = tasks["load-corpus"]["inputs"]["parameters"]["kfp_run_id"]
    assert corpus_id["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    for t in STEPS:  # a cached step would create no TrainJob
        assert not tasks[t].get("cachingOptions", {}).get("enableCache", False)
    # Each step learns its namespace and its run's id from its own pod (the downward API), on
    # every KFP 2.x backend: components/step/context.py.
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for t in STEPS:
        executor = tasks[t]["componentRef"]["name"].replace("comp-", "exec-")
        env = {e["name"]: e["fieldPath"] for e in executors[executor]["fieldPathAsEnv"]}
        assert env == {"GPT_STEP_NAMESPACE": "metadata.namespace",
                       "GPT_KFP_RUN_ID": "metadata.labels['pipeline/runid']"}, t  # fmt: skip
    params = spec["root"]["inputDefinitions"]["parameters"]
    for knob in ("source", "tokenizer", "n_layer", "n_embd", "max_iters", "time_budget",
                 "num_nodes", "num_proc_per_node", "temperature", "top_k", "top_p", "prompt",
                 "idle_timeout", "namespace", "backend", "storage_secret",
                 "export_uri"):  # fmt: skip
        assert knob in params, f"pipeline parameter {knob} missing"
    # The workload image is fixed at compile time from images.env and handed to every step, so
    # what a TrainJob runs never depends on the component image a step happens to run in.
    assert params["workload_image"]["defaultValue"] == workload_image()
    for t in STEPS:
        given = tasks[t]["inputs"]["parameters"]["workload_image"]
        assert given["componentInputParameter"] == "workload_image"
    # Object storage: the Secret's name (never a value) reaches the two steps that read or write
    # it, the export's prefix the training step; by default neither is set.
    # The Model Registry likewise: train-gpt's, off by default.
    for t, knobs in (("load-corpus", ["storage_secret"]),
                     ("train-gpt", ["storage_secret", "export_uri", "model_registry",
                                    "model_name"])):  # fmt: skip
        for knob in knobs:
            assert tasks[t]["inputs"]["parameters"][knob]["componentInputParameter"] == knob
            assert params[knob].get("defaultValue", "") == ""
    assert "storage_secret" not in tasks["generative-prompt"]["inputs"]["parameters"]


def test_serve_adds_the_deploy_step_after_train_gpt_and_only_then():
    """The compiled pipeline with serve empty (the default) runs the three stages alone; with
    serve=kserve, also deploy-model on train-gpt's run. The committed YAML is the compile
    (test_committed_yaml_is_what_make_compile_writes)."""
    spec, platform = yaml.safe_load_all(COMPILED.read_text())
    root = spec["root"]
    assert root["inputDefinitions"]["parameters"]["serve"]["defaultValue"] == ""
    gate = root["dag"]["tasks"]["condition-1"]
    assert gate["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--serve'] != ''")
    assert gate["dependentTasks"] == ["train-gpt"]
    assert gate["inputs"]["parameters"]["pipelinechannel--train-gpt-Output"] == {
        "taskOutputParameter": {"producerTask": "train-gpt", "outputParameterKey": "Output"}}
    (deploy,) = spec["components"]["comp-condition-1"]["dag"]["tasks"].values()
    assert deploy["componentRef"]["name"] == "comp-deploy-model"
    assert deploy["inputs"]["parameters"]["run"] == {
        "componentInputParameter": "pipelinechannel--train-gpt-Output"}
    for knob in ("serve", "serve_timeout", "serve_gpus", "serve_service_account", "export_uri",
                 "block_size", "namespace", "backend"):  # shared with the stages where named
        assert deploy["inputs"]["parameters"][knob] == {
            "componentInputParameter": f"pipelinechannel--{knob}"}, knob
    assert not deploy.get("cachingOptions", {}).get("enableCache", False)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    env = {e["name"]: e["fieldPath"] for e in executors["exec-deploy-model"]["fieldPathAsEnv"]}
    assert env["GPT_STEP_NAMESPACE"] == "metadata.namespace"
    outputs = spec["components"]["comp-deploy-model"]["outputDefinitions"]
    assert outputs["parameters"]["Output"]["parameterType"] == "STRING"  # the endpoint
    assert outputs["artifacts"]["usage"]["artifactType"]["schemaTitle"] == "system.Markdown"
    # train-gpt's Model artifact, whatever serve is
    model = spec["components"]["comp-train-gpt"]["outputDefinitions"]["artifacts"]["model"]
    assert model["artifactType"]["schemaTitle"] == "system.Model"


def test_serve_kserve_is_refused_in_one_line_by_the_local_backend(tmp_path, capsys):
    from pipeline.__main__ import main

    assert main(["run-local", "--root", str(tmp_path), "--run", "r", "--set", "serve=kserve"]) == 1
    err = capsys.readouterr().err
    assert err == ("python -m pipeline run-local: error: serve 'kserve': the local backend has "
                   "no KServe; serve the model on this machine with `make serve`\n")
    assert not any(tmp_path.iterdir()), "nothing may run or be written"


@pytest.mark.process
def test_committed_yaml_is_what_make_compile_writes(tmp_path):
    fresh = compile_fresh(tmp_path).read_text()
    assert COMPILED.read_text() == fresh, f"{COMPILED.name} is stale: run `make compile`"


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda r: train_gpt.python_func(run="r", n_head=3, backend="local", root=r, **ART),
         "--n_embd 128: must be divisible by --n_head 3"),
        (lambda r: train_gpt.python_func(run="r", num_nodes=2, backend="local", root=r, **ART),
         "num_nodes 2: the local backend runs on this one machine"),
        (lambda r: train_gpt.python_func(run="r", backend="cloud", root=r, **ART),
         "backend 'cloud': must be one of trainjob, local"),
        (lambda r: train_gpt.python_func(run="r", root=r, namespace="ns", **ART),
         "the trainjob backend keeps runs on PVC gpt-pvc"),
        (lambda r: train_gpt.python_func(run="r", root="/gpt", workload_image="img", **ART),
         "namespace: empty, and this step runs outside a pod"),
        (lambda r: train_gpt.python_func(run="r", namespace="Bad_NS", root="/gpt",
                                         workload_image="img", **ART),
         "namespace 'Bad_NS': not a valid Kubernetes namespace name"),
        (lambda r: train_gpt.python_func(run="r", root="/gpt", namespace="ns", **ART),
         "workload_image: empty"),
        (lambda r: load_corpus.python_func(run="r", tokenizer="bpe", backend="local", root=r,
                                           corpus_stats=None),
         "argument --tokenizer: invalid choice: 'bpe'"),
        (lambda r: load_corpus.python_func(run="../x", backend="local", root=r, corpus_stats=None),
         "--run '../x': not a valid run id"),
        (lambda r: generative_prompt.python_func(run="r", top_p=0, backend="local", root=r,
                                                 transcript=None),
         "--top_p"),
        (lambda r: load_corpus.python_func(run="r", root="/gpt", namespace="ns",
                                           workload_image="img", storage_secret="Bad_Name",
                                           corpus_stats=None),
         "storage_secret 'Bad_Name': not a valid Kubernetes Secret name"),
        (lambda r: load_corpus.python_func(run="r", backend="local", root=r, corpus_stats=None,
                                           storage_secret="gpt-s3"),
         "storage_secret 'gpt-s3': the local backend has no Secrets"),
        (lambda r: train_gpt.python_func(run="r", backend="local", root=r,
                                         export_uri="s3:///model", **ART),
         "--export_uri 's3:///model': no bucket"),
    ],
    ids=["config-check", "local-nodes", "backend", "root", "no-namespace", "namespace", "no-image",
         "choice", "run", "top_p", "secret-name", "secret-local", "export-uri"],
)  # fmt: skip
def test_bad_input_stops_a_step_before_anything_starts(call, message, tmp_path):
    root = tmp_path / "root"
    with pytest.raises(ValueError) as err:
        call(str(root))
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not root.exists(), "a refused step must leave nothing behind"


ART = dict(metrics=None, report=None, model=None)

@pytest.mark.slow
def test_the_compiled_pipeline_runs_end_to_end_with_kfp_local(tmp_path, model_registry):
    """Every step, and train-gpt's registration of its model in the Model Registry (Prism
    holding the requests to its spec: tests/support/registry.py)."""
    root = tmp_path / "runs"
    address, store, _ = model_registry
    knobs = {**TINY_PIPELINE, "model_registry": address, "model_name": "tiny-pipeline-gpt"}
    sets = [a for k, v in knobs.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    token = tmp_path / "token"  # where a KFP step's pod has its service account's token
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "run-local", "--root", str(root), "--run", "tiny",
         *sets],
        cwd=PROJECT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "KF_PIPELINES_SA_TOKEN_PATH": str(token)},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # The stages' run directory survives kfp.local (which deletes its own workspace).
    run = root / "tiny"
    for rel in ("data/meta.json", "model", "metrics/train.jsonl", "prompt/transcript.jsonl"):
        assert (run / rel).exists(), rel
    # The steps' artifacts, as KFP recorded them (staged, then moved under the run's name).
    assert [p.name for p in (root / "kfp-outputs").iterdir()] == ["tiny"]
    (outputs,) = (root / "kfp-outputs" / "tiny").iterdir()
    executor = json.loads((outputs / "train-gpt" / "executor_output.json").read_text())
    metrics = executor["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    last = [json.loads(line) for line in (run / "metrics/train.jsonl").read_text().splitlines()]
    assert metrics["steps"] == 20 and metrics["train_loss"] == last[-1]["loss"]
    assert 0 < metrics["val_bits_per_byte"] < 10 and metrics["tokens_per_s"] > 0
    assert "data:image/png;base64," in (outputs / "train-gpt" / "report").read_text()
    transcript = (outputs / "generative-prompt" / "transcript").read_text()
    assert "> To be" in transcript and "> or not" in transcript
    # train-gpt registered the run: a version named after it, its model/ folder, what it was.
    assert (f"model registry {address}: registered tiny-pipeline-gpt version tiny "
            f"({(run / 'model').as_uri()})") in out.stdout + out.stderr  # fmt: skip
    (version,) = [v for v in store.versions.values() if v["name"] == "tiny"]
    (artifact,) = store.artifacts[version["id"]]
    assert artifact["uri"] == (run / "model").as_uri()
    config = json.loads((run / "model" / "config.json").read_text())
    props = version["customProperties"]
    assert props["architecture"]["string_value"] == config["architectures"][0]
    assert props["val_bits_per_byte"]["double_value"] == metrics["val_bits_per_byte"]
    # train-gpt's Model artifact: where the model is and what it is, as KFP records it.
    model = executor["artifacts"]["model"]["artifacts"][0]
    assert model["metadata"]["model_uri"] == (run / "model").as_uri()
    assert model["metadata"]["architecture"] == config["architectures"][0]
    assert model["metadata"]["val_bits_per_byte"] == metrics["val_bits_per_byte"]
    assert (model["metadata"]["run"], model["metadata"]["model_format"]) == ("tiny", "huggingface")
    record = json.loads((outputs / "train-gpt" / "model").read_text())
    assert record == model["metadata"]
    # serve empty (the default): no deploy step ran.
    assert sorted(p.name for p in outputs.iterdir() if p.is_dir()) == [
        "generative-prompt", "load-corpus", "train-gpt"]


@pytest.mark.process
def test_in_the_component_image_every_stage_checks_its_flags_before_a_trainjob(tmp_path):
    # The component image has none of the workload's packages (PyTorch, numpy, tiktoken, ...):
    # the stages' configs must still load there, so a bad flag stops the step before it creates
    # anything. Block those packages as the image lacks them, then validate each stage.
    import tomllib

    deps = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    blocked = [re.split(r"[\[<>=!~; ]", d)[0] for d in deps]
    probe = textwrap.dedent(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None  # `import name` now raises ImportError
        from components.step import dispatch
        from components.trainjob.placement import Placement
        from gpt.stages import STAGES

        def check(name, flags):
            try:
                return dispatch.validate(STAGES[name], {{"root": "/gpt", "run": "r", **flags}},
                                       Placement(timeout=60), backend="trainjob", image="img",
                                       namespace="training")
            except ValueError as e:
                return "refused: " + str(e)

        print(check("load-corpus", {{"tokenizer": "char"}}))
        print(check("load-corpus", {{"val_fraction": 1.5}}))
        print(check("train-gpt", {{"n_layer": 2}}))
        print(check("train-gpt", {{"n_head": 3}}))
        print(check("generative-prompt", {{"top_p": 0.9}}))
        print(check("generative-prompt", {{"temperature": -1}}))
        print(sorted(m for m in {blocked!r} if sys.modules.get(m) is not None))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=PROJECT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(["--root", "/gpt", "--run", "r", "--tokenizer", "char"])
    assert lines[1].startswith("refused: --val_fraction 1.5")
    assert lines[2] == str(["--root", "/gpt", "--run", "r", "--n_layer", "2"])
    assert lines[3] == "refused: --n_embd 128: must be divisible by --n_head 3"
    assert lines[4] == str(["--root", "/gpt", "--run", "r", "--top_p", "0.9"])
    assert lines[5].startswith("refused: --temperature -1")
    assert lines[6] == "[]", "a workload package was imported after all"


def test_upload_creates_the_pipeline_then_adds_versions(monkeypatch, tmp_path):
    import kfp

    from pipeline.__main__ import upload

    calls = []

    class FakeClient:
        def __init__(self, host=None):
            calls.append(("host", host))

        def get_pipeline_id(self, name):
            return "p-1" if any(c[0] == "upload_pipeline" for c in calls) else None

        def upload_pipeline(self, path, pipeline_name):
            calls.append(("upload_pipeline", pipeline_name))

        def upload_pipeline_version(self, path, pipeline_version_name, pipeline_id):
            calls.append(("upload_pipeline_version", pipeline_id, pipeline_version_name))

    monkeypatch.setattr(kfp, "Client", FakeClient)
    package = tmp_path / "p.yaml"
    package.write_text("x")
    upload(package, "http://kfp", "gpt-trainjobs", None)
    upload(package, "http://kfp", "gpt-trainjobs", None)
    assert calls[:2] == [("host", "http://kfp"), ("upload_pipeline", "gpt-trainjobs")]
    kind, pipeline_id, version = calls[-1]
    assert (kind, pipeline_id) == ("upload_pipeline_version", "p-1") and version.startswith("v-")
