"""The compiled pipeline itself on the test cluster: kfp.local runs the steps as local processes,
each step creates its TrainJob on the API server, the test cluster runs it through the runtime's
own command, env and `/gpt` mount, and the step reads the results back from the pod's log, which
the kubelet rotates while the step follows it."""

from __future__ import annotations

import json

import pytest
from support.cluster.kfp_step import step_env, unresolved_run_id
from support.cluster.kubelet import LogRotation
from support.runs import TINY_PIPELINE  # as in the local backend's end-to-end test

from gpt.stages import STAGES
from pipeline.__main__ import COMPILED

RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id


@pytest.mark.slow
@pytest.mark.apiserver
# kfp.local warns that the steps' image is not this Python; running them here is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_compiled_pipeline_completes_on_the_test_cluster(trainer_cluster, tmp_path,
                                                             monkeypatch):  # fmt: skip
    """With the pipeline's own defaults for `run` and `namespace` (both empty), on a KFP backend
    that leaves the run-id placeholder unresolved (before 2.5.0), in a namespace that is not
    `training`: the run is the KFP run id, everything lives in the steps' own namespace. Every
    artifact arrives though train-gpt's log is rotated while the step follows it."""
    from kfp import components, local

    ns = trainer_cluster.namespace
    assert ns != "training"
    for name, value in step_env(COMPILED, ns, RUN_ID).items():
        monkeypatch.setenv(name, value)
    # Rotation at 2 KiB, looked at every 3 s: train-gpt's log (a progress line every step, for
    # 4 s of training) is rotated while it is followed. The short stages' logs stay below it:
    # on the test cluster a pod may end before the follower first looks (every 0.5 s), and
    # then a plain read, as `kubectl logs` gives, is all there is.
    trainer_cluster.kubelet.rotation = LogRotation(max_size=2048)
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
    pipeline = components.load_component_from_file(str(COMPILED))
    with unresolved_run_id():
        pipeline(backend="trainjob", root="/gpt",
                 **{**TINY_PIPELINE, "log_interval": 1, "max_iters": 100_000,
                    "time_budget": 4.0})  # fmt: skip

    # A TrainJob per stage in the steps' namespace, one per stage and runtime, labelled with the
    # run, each Complete.
    runs = trainer_cluster.runs
    labels = [r.trainjob["metadata"]["labels"] for r in runs.values()]
    assert sorted(lab["gpt-trainjobs/stage"] for lab in labels) == sorted(STAGES)
    assert {lab["pipeline/runid"] for lab in labels} == {RUN_ID}
    for name, run in runs.items():
        assert run.trainjob["metadata"]["namespace"] == ns
        assert run.error is None and len(run.pods) == 1, name
        assert run.pods[0].proc.returncode == 0, run.pods[0].log
    # The stages wrote the PVC (mounted at /gpt in the pods, this folder here).
    rundir = tmp_path / "pvc" / RUN_ID
    for rel in ("data/meta.json", "model/model.safetensors", "metrics/train.jsonl",
                "prompt/transcript.jsonl"):  # fmt: skip
        assert (rundir / rel).is_file(), rel
    train_run = next(run for name, run in runs.items() if name.startswith("train"))
    assert list(train_run.pods[0].folder.glob("node.log.*")), "the train-gpt log was never rotated"
    # KFP's artifacts, from the files the pods printed into their logs.
    outputs = {p.parent.name: p for p in (tmp_path / "kfp").rglob("executor_output.json")}
    train = json.loads(outputs["train-gpt"].read_text())
    metrics = train["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    last = json.loads((rundir / "metrics/train.jsonl").read_text().splitlines()[-1])
    assert metrics["steps"] == last["step"] < 100_000  # stopped by the time budget
    assert metrics["train_loss"] == last["loss"]
    assert "data:image/png;base64," in (outputs["train-gpt"].parent / "report").read_text()
    # train-gpt's Model artifact: the run's model/ on the claim, as KServe names it.
    model = train["artifacts"]["model"]["artifacts"][0]["metadata"]
    assert model["model_uri"] == f"pvc://gpt-pvc/{RUN_ID}/model"
    assert (model["run"], model["kfp_run"]) == (RUN_ID, RUN_ID)
    corpus = json.loads(outputs["load-corpus"].read_text())["artifacts"]["corpus_stats"]
    assert corpus["artifacts"][0]["metadata"]["vocab_size"] > 0
    transcript = (outputs["generative-prompt"].parent / "transcript").read_text()
    assert "> To be" in transcript and "> or not" in transcript
