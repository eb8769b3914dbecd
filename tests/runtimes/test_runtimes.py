"""The runtimes and the components' TrainJobs, against the real API server with the v2.3.0 CRDs.

The server validates exactly as a cluster does (OpenAPI schema, CEL, defaulting); the test plays
the Trainer controller and the pod: it completes each TrainJob and answers the log request by
running the TrainJob's own command (its file-printing shell) over a prepared run directory.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from kfp import dsl
from support.apiserver import Controller, apply_cluster_object, condition, namespace
from support.paths import PROJECT

from components.generative_prompt import generative_prompt
from components.load_corpus import load_corpus
from components.train_gpt import train_gpt
from components.trainjob import launcher, podlogs
from components.trainjob.attach import attach_hint
from components.trainjob.launcher import GROUP, PLURAL, VERSION
from gpt.stages import STAGES

RUNTIMES = {p.stem: yaml.safe_load(p.read_text()) for p in PROJECT.glob("runtimes/gpt-*.yaml")}
CTR = "clustertrainingruntimes"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def pod_spec(runtime: dict) -> dict:
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]


def test_the_stages_that_fetch_keep_the_hub_cache_on_the_volume(monkeypatch):
    """HF_HOME in the runtimes of the stages with --init_from is on the PVC, where cache_dir
    would put it with no HF_HOME at all: one copy per volume, found by every rank, every run
    and the next stage; a stage without --init_from needs none."""
    from gpt.config.configs import InitFromConfig
    from gpt.fetch.model_source import cache_dir

    for stage in STAGES.values():
        (container,) = pod_spec(RUNTIMES[stage.runtime])["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if not issubclass(stage.config, InitFromConfig):
            assert "HF_HOME" not in env, stage.name
            continue
        (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "gpt"]
        monkeypatch.delenv("HF_HOME", raising=False)
        on_volume = cache_dir(mount)
        monkeypatch.setenv("HF_HOME", env["HF_HOME"])
        assert cache_dir(mount) == on_volume, stage.name


def test_the_runtimes_follow_the_sdk_shape_and_share_the_pvc():
    assert set(RUNTIMES) == {stage.runtime for stage in STAGES.values()}
    for name, rt in RUNTIMES.items():
        assert rt["kind"] == "ClusterTrainingRuntime" and rt["metadata"]["name"] == name
        assert rt["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
        assert rt["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
        (job,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
        assert job["name"] == "node"
        labels = job["template"]["metadata"]["labels"]
        assert labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
        pod = pod_spec(rt)
        (container,) = pod["containers"]
        assert container["name"] == podlogs.CONTAINER
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["fsGroup"]
        # Not a re-chown of the whole PVC at every pod start.
        assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
        # A profile namespace's Istio sidecar would keep the Job's pod from ever completing.
        pod_labels = job["template"]["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["sidecar.istio.io/inject"] == "false"
        assert container["resources"]["requests"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/gpt"]]["persistentVolumeClaim"]["claimName"] == "gpt-pvc"
        interactive = name == "gpt-generative-prompt"
        assert container.get("stdin", False) is container.get("tty", False) is interactive


def test_the_kustomization_applies_every_stages_runtime():
    kustomization = yaml.safe_load((PROJECT / "runtimes/kustomization.yaml").read_text())
    assert kustomization["resources"] == [f"{stage.runtime}.yaml" for stage in STAGES.values()]
    assert all(RUNTIMES[stage.runtime]["metadata"]["name"] == stage.runtime
               for stage in STAGES.values())  # fmt: skip


@pytest.mark.apiserver
def test_runtimes_apply_and_are_accepted_as_written(custom_api):
    for name, rt in RUNTIMES.items():
        apply_cluster_object(custom_api, rt)
        stored = custom_api.get_cluster_custom_object(GROUP, VERSION, CTR, name)
        # Nothing pruned: every field we wrote is in the schema and kept.
        assert pod_spec(stored)["containers"] == pod_spec(rt)["containers"]
        assert pod_spec(stored)["securityContext"] == pod_spec(rt)["securityContext"]


# ---- each component's TrainJob -------------------------------------------------------------------


def prepared_run(root: Path, run: str) -> Path:
    """A run directory as the three stages leave it."""
    r = root / run
    for rel, data in {
        "data/meta.json": json.dumps({"vocab_size": 65, "train_tokens": 900, "val_tokens": 100}),
        "corpus/source.json": "{}",
        "metrics/train.jsonl": "".join(
            json.dumps(rec) + "\n"
            for rec in (
                {"step": 10, "loss": 3.0, "lr": 1e-3, "tokens_per_s": 1000.0},
                {"step": 20, "loss": 2.5, "lr": 1e-3, "tokens_per_s": 3000.0, "val_loss": 2.7,
                 "val_bpb": 3.9},
                {"step": 30, "loss": 2.0, "lr": 1e-4, "tokens_per_s": 2000.0},
            )
        ),
        "metrics/report.md": "# train-gpt: run\n\n![loss](loss.png)\n",
        "prompt/transcript.jsonl": json.dumps({"prompt": "To be", "reply": "or not"}) + "\n",
    }.items():
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(data)
    (r / "metrics" / "loss.png").write_bytes(PNG)
    return root


@pytest.fixture
def pod(custom_api, tmp_path, monkeypatch):
    """Plays the pod: a `PodLogs` whose log runs the TrainJob's command over a local run
    directory (the pod is named as its TrainJob here)."""
    root = prepared_run(tmp_path / "gpt", "run-1")

    class RunsTheCommand:
        def refs(self, ns, trainjob):
            return [podlogs.PodRef(trainjob, 0, phase="Running")]

        def pods(self, ns, trainjob):
            return [trainjob]

        def log(self, ns, name, tail):
            trainer = custom_api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)[
                "spec"
            ]["trainer"]
            python, flag, source, *carried = trainer["command"]
            assert (python, flag, carried[-1]) == ("python3", "-c", "--")
            # The stage itself is not run (no image here): `true` stands in for it.
            carried = [a.replace("/gpt/", f"{root}/") for a in carried]
            out = subprocess.run(
                [python, flag, source, *carried, "true"], capture_output=True, text=True,
                check=True,
            )  # fmt: skip
            return out.stdout

    monkeypatch.setattr(launcher, "from_environment", RunsTheCommand)
    return RunsTheCommand


def artifact(cls, tmp_path: Path, name: str):
    return cls(name=name, uri=str(tmp_path / name))


CASES = {
    "load-corpus": (
        load_corpus,
        dict(run="run-1", source="default", tokenizer="char", block_size=32),
        "gpt-load-corpus",
        ["python", "-m", "gpt", "load-corpus"],
    ),
    "train-gpt": (
        train_gpt,
        dict(run="run-1", n_layer=2, max_iters=30, warmup_iters=5, num_proc_per_node=2),
        "gpt-train-gpt",
        ["python", "-m", "gpt.distributed.torchrun", "-m", "gpt", "--", "train-gpt"],
    ),
    "generative-prompt": (
        generative_prompt,
        dict(run="run-1", prompt=[], idle_timeout=300, top_k=0),
        "gpt-generative-prompt",
        ["python", "-m", "gpt", "generative-prompt"],
    ),
}


@pytest.mark.apiserver
@pytest.mark.parametrize("stage", list(CASES))
def test_each_component_creates_an_accepted_trainjob_and_reports_back(
    stage, custom_api, kubeconfig_env, pod, tmp_path, capsys
):
    component, params, runtime, program = CASES[stage]
    ns = namespace()
    ctl = Controller(custom_api, ns, condition("Complete", "JobsCompleted", "done"))
    outputs = {
        "load-corpus": lambda: dict(corpus_stats=artifact(dsl.Metrics, tmp_path, "stats")),
        "train-gpt": lambda: dict(
            metrics=artifact(dsl.Metrics, tmp_path, "metrics"),
            report=artifact(dsl.HTML, tmp_path, "report"),
            model=artifact(dsl.Model, tmp_path, "model"),
        ),
        "generative-prompt": lambda: dict(
            transcript=artifact(dsl.Markdown, tmp_path, "transcript")
        ),
    }[stage]()
    image = "registry.example.com/team/gpt-workload:run-override"
    result = component.python_func(
        **params, **outputs, namespace=ns, backend="trainjob", workload_image=image
    )
    ctl.join(5)
    assert ctl.error is None

    # What the API server accepted: runtimeRef + trainer only, the workload image, the stage's
    # command with its flags named as in the CLI.
    job = ctl.created
    assert re.fullmatch(f"{stage}-[0-9a-f]{{8}}", job["metadata"]["name"])
    assert job["metadata"]["labels"][launcher.RUN_LABEL] == "run-1"
    defaulted = {"managedBy", "suspend"}  # the CRD's defaults, not ours
    assert set(job["spec"]) - defaulted == {"runtimeRef", "trainer", "activeDeadlineSeconds"}
    assert job["spec"]["runtimeRef"]["name"] == runtime
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == image  # what the pipeline passed, not what the step's image holds
    assert trainer["args"][: len(program)] == program
    args = trainer["args"][len(program) :]
    assert args[:4] == ["--root", "/gpt", "--run", "run-1"]
    log = capsys.readouterr().out

    if stage == "load-corpus":
        assert result == "run-1"
        assert "--tokenizer char" in shlex.join(args)
        assert outputs["corpus_stats"].metadata["vocab_size"] == 65
    elif stage == "train-gpt":
        assert trainer["numProcPerNode"] == 2 and trainer["numNodes"] == 1
        assert "--n_layer 2" in shlex.join(args) and "--warmup_iters 5" in shlex.join(args)
        m = outputs["metrics"].metadata
        assert (m["train_loss"], m["val_loss"], m["val_bits_per_byte"]) == (2.0, 2.7, 3.9)
        assert m["tokens_per_s"] == 2000.0  # the median: robust to the warm-up step
        html = Path(outputs["report"].path).read_text()
        assert "data:image/png;base64," in html
    else:
        # Interactive: no --prompt, top_k 0 (no limit), and the way in is printed.
        assert "--prompt" not in args and "--top_k 0" in shlex.join(args)
        assert "--idle_timeout 300" in shlex.join(args)
        assert f"kubectl -n {ns} attach -it" in log
        assert f"{podlogs.JOBSET_LABEL}={job['metadata']['name']}" in log
        md = Path(outputs["transcript"].path).read_text()
        assert "> To be" in md and "or not" in md


def test_attach_hint_names_the_pod_once_an_update_finds_it():
    said = []

    pods = []

    class Pods:
        def pods(self, ns, trainjob):
            return list(pods)

    hint = attach_hint(said.append, Pods())
    job = {"metadata": {"name": "generative-prompt-r-abc123", "namespace": "training"}}
    hint(job)
    assert len(said) == 1 and "get pod -l jobset.sigs.k8s.io/jobset-name=" in said[0]
    pods.append("generative-prompt-r-abc123-node-0-0-xyz")
    hint(job)
    hint(job)
    assert said[1:] == [
        "Pod generative-prompt-r-abc123-node-0-0-xyz is up; attach with:\n"
        "  kubectl -n training attach -it generative-prompt-r-abc123-node-0-0-xyz -c node"
    ]


def test_with_a_web_port_the_hint_is_the_port_forward_to_the_chat_page():
    said = []

    class Pods:
        def pods(self, ns, trainjob):
            return ["generative-prompt-r-abc123-node-0-0-xyz"]

    hint = attach_hint(said.append, Pods(), web_port=8080)
    hint({"metadata": {"name": "generative-prompt-r-abc123", "namespace": "training"}})
    assert said[0].splitlines()[1].startswith(
        "  kubectl -n training port-forward $(kubectl -n training get pod -l "
        "jobset.sigs.k8s.io/jobset-name=generative-prompt-r-abc123 -o name) 8080:8080")
    assert said[1] == (
        "Pod generative-prompt-r-abc123-node-0-0-xyz is up; open its chat page with:\n"
        "  kubectl -n training port-forward generative-prompt-r-abc123-node-0-0-xyz 8080:8080\n"
        "  then open http://localhost:8080/ in your browser")


def test_the_train_runtime_leaves_a_lost_node_within_a_minute():
    """Without its own tolerations a pod gets DefaultTolerationSeconds' 300 s for an
    unreachable or not-ready node (kubernetes plugin/pkg/admission/defaulttolerationseconds)."""
    runtime = yaml.safe_load((PROJECT / "runtimes/gpt-train-gpt.yaml").read_text())
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    tolerations = rjob["template"]["spec"]["template"]["spec"]["tolerations"]
    for taint in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"):
        (t,) = [t for t in tolerations if t["key"] == taint]
        assert t["effect"] == "NoExecute" and t["operator"] == "Exists"
        assert 0 < t["tolerationSeconds"] <= 60
