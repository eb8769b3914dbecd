"""The compiled pipeline itself on the test cluster: kfp.local runs the steps as local processes,
each step creates its TrainJob on the API server, the test cluster runs it through the runtime's
own command, env and `/gpt` mount, and the step reads the results back from the pod's log."""

from __future__ import annotations

import json

import pytest
from test_pipeline import TINY  # the same tiny run as the local backend's end-to-end test

from pipeline.__main__ import COMPILED


@pytest.mark.slow
@pytest.mark.apiserver
# kfp.local warns that the steps' image is not this Python; running them here is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_compiled_pipeline_completes_on_the_test_cluster(trainer_cluster, tmp_path):
    from kfp import components, local

    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
    pipeline = components.load_component_from_file(str(COMPILED))
    pipeline(backend="trainjob", namespace=trainer_cluster.namespace, root="/gpt", run="tiny",
             **TINY)  # fmt: skip

    # Three TrainJobs, one per stage, each on its own runtime, each Complete.
    runs = trainer_cluster.runs
    stages = sorted(name.rsplit("-tiny-", 1)[0] for name in runs)
    assert stages == ["generative-prompt", "load-corpus", "train-gpt"]
    for name, run in runs.items():
        assert run.error is None and len(run.pods) == 1, name
        assert run.pods[0].proc.returncode == 0, run.pods[0].log
    # The stages wrote the PVC (mounted at /gpt in the pods, this folder here).
    rundir = tmp_path / "pvc" / "tiny"
    for rel in ("data/meta.json", "model/model.safetensors", "metrics/train.jsonl",
                "prompt/transcript.jsonl"):  # fmt: skip
        assert (rundir / rel).is_file(), rel
    # KFP's artifacts, from the files the pods printed into their logs.
    outputs = {p.parent.name: p for p in (tmp_path / "kfp").rglob("executor_output.json")}
    train = json.loads(outputs["train-gpt"].read_text())
    metrics = train["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    last = json.loads((rundir / "metrics/train.jsonl").read_text().splitlines()[-1])
    assert metrics["steps"] == 20 and metrics["train_loss"] == last["loss"]
    assert "data:image/png;base64," in (outputs["train-gpt"].parent / "report").read_text()
    transcript = (outputs["generative-prompt"].parent / "transcript").read_text()
    assert "> To be" in transcript and "> or not" in transcript
