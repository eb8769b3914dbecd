"""The built images themselves (`make test-images`): what they hold, who they run as, and the
project run inside them on the test cluster: each TrainJob's pods in the workload image with
their runtime's command, env, user and /gpt volume, each pipeline step's own command from the
compiled pipeline in the component image, creating its TrainJob on the real API server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cluster.images import Image, container_command
from support.cluster.kfp_step import step_env, unresolved_run_id
from support.runs import TINY_PIPELINE, write_data
from support.trainjobs import train_on_cluster

from gpt.stages import STAGES

pytestmark = [pytest.mark.slow]

# Budgets (docs/performance.md has the measured sizes): the CPU workload image is the base,
# g++ and CPU PyTorch with its friends; the component image the base and kfp. A CUDA build
# (PyPI's torch) is ~6 GB and is not built here.
WORKLOAD_BUDGET = 2.5e9
COMPONENT_BUDGET = 0.7e9
RUN_ID = "0d5e3c1a-7b2f-4e8d-9c6a-5f1e2d3c4b5a"


def run_in(image: Image, argv: list[str], tmp_path: Path, mounts: dict[str, Path] | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """`argv` in `image` as its own USER and WORKDIR, as `docker run IMAGE ARGV` would."""
    spec = tmp_path / f"run-{len(list(tmp_path.iterdir()))}.json"
    command = container_command(image, spec, argv, env or {}, mounts or {},
                                image.own_identity(), image.workdir or "/")  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def image_size(name: str) -> float:
    """Bytes, as `buildah images` reports the image's size ("1.94 GB": decimal units)."""
    out = subprocess.run(["buildah", "images", "--json", name], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    (entry,) = json.loads(out)
    number, unit = entry["size"].split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_the_build_asked_no_index_and_installed_the_wheelhouse_torch(built, image_rootfs,
                                                                     tmp_path):  # fmt: skip
    # pip says where it looks: only the wheelhouse, never an index (where its steps ran, not
    # taken from the layer cache).
    assert "Looking in indexes" not in built.log
    workload = image_rootfs[built.workload]
    probe = run_in(workload, ["python", "-c", "import torch, gpt; print(torch.__version__)"],
                   tmp_path)  # fmt: skip
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert probe.stdout.strip() == "2.13.0+cpu"  # the wheelhouse's, from this machine's disk
    compiled = (built.checkout / "pipeline" / "gpt_trainjobs_pipeline.yaml").read_text()
    assert f"image: {built.component}" in compiled and built.workload in compiled
    # docs/cluster.md shows the commands this build ran (tests/images/conftest.py).
    guide = (built.checkout / "docs" / "cluster.md").read_text()
    ran = ["make wheelhouse WHEELHOUSE=", "make build-images WHEELHOUSE=",
           "make wheelhouse TORCH_INDEX_URL=`", "CONTAINER_TOOL=podman"]
    if built.stand_in:
        ran += [f"docker/debian-base.sh {built.base} buildah", f"BASE_IMAGE={built.base}"]
    assert all(command in guide for command in ran), [c for c in ran if c not in guide]


def test_images_fit_their_budgets_and_nothing_runs_as_root(built, image_rootfs, tmp_path,
                                                           report):  # fmt: skip
    sizes = {name: image_size(name) for name in (built.workload, built.component)}
    report(", ".join(f"{name} {size / 1e9:.2f} GB" for name, size in sizes.items())
        + f" (on {built.base})")
    assert sizes[built.workload] <= WORKLOAD_BUDGET, sizes
    assert sizes[built.component] <= COMPONENT_BUDGET, sizes
    for name, image in image_rootfs.items():
        assert image.user == "1000:1000", (name, image.user)
        who = run_in(image, ["sh", "-c", "id -u; id -g; touch $HOME/w && echo home-writable"],
                     tmp_path)  # fmt: skip
        assert who.stdout.split() == ["1000", "1000", "home-writable"], who.stdout + who.stderr
    # KFP's launcher writes a step's artifacts under these (kubeflow/pipelines#10397).
    component = image_rootfs[built.component]
    dirs = run_in(component, ["sh", "-c", "for d in /gcs /minio /s3; do mkdir -p $d/x && "
                              "echo $d; done"], tmp_path)  # fmt: skip
    assert dirs.stdout.split() == ["/gcs", "/minio", "/s3"], dirs.stdout + dirs.stderr


def owners(folder: Path) -> set[tuple[int, int]]:
    return {(p.stat().st_uid, p.stat().st_gid) for p in folder.rglob("*") if p.is_file()}


def test_two_nodes_train_in_the_workload_image(built, pvc, trainer_cluster):
    write_data(pvc, "ddp")
    train_on_cluster(trainer_cluster, "ddp", 2, 1, image=built.workload, max_iters=8,
                     eval_interval=4, ckpt_interval=4)  # fmt: skip
    (run,) = trainer_cluster.runs.values()
    last = [p for p in run.pods if p.attempt == run.restarts]
    assert [p.index for p in last] == [0, 1]
    assert all((p.folder / "container.json").is_file() for p in last)  # ran in the image
    assert "2 process(es) on cpu" in last[0].log and "done: 8 steps" in last[0].log
    # What the stage wrote, it wrote as the runtime's user, in the fsGroup.
    written = owners(pvc / "ddp" / "ckpt")
    assert written == {(1000, 1000)}, written


# kfp.local warns that the steps' image is not this Python; running them in it is the point.
@pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")
def test_the_pipeline_runs_in_the_images_end_to_end(built, image_rootfs, trainer_cluster,
                                                    apiserver, tmp_path, monkeypatch):  # fmt: skip
    """kfp.local walks the compiled pipeline; each step's own command (`sh -ec` and KFP's
    executor) runs in the component image as its user, creates its TrainJob on the API server,
    and the test cluster runs the TrainJob's pod in the workload image; the export loads with
    transformers in the workload image."""
    from kfp import components, local
    from kfp.local import subprocess_task_handler

    component = image_rootfs[built.component]
    compiled = built.checkout / "pipeline" / "gpt_trainjobs_pipeline.yaml"
    ns = trainer_cluster.namespace
    for name, value in step_env(compiled, ns, RUN_ID).items():
        monkeypatch.setenv(name, value)
    steps: list[Path] = []
    # The step's credentials, readable by the image's user (a step reads its service account's
    # token; here the test server's kube config and the client certificate it names).
    kube = tmp_path / "kube"
    shutil.copytree(apiserver.workdir / "pki", kube / "pki")
    (kube / "config").write_text(apiserver.kubeconfig.read_text()
                                 .replace(str(apiserver.workdir), str(kube)))  # fmt: skip
    for path in [kube, *kube.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)

    def in_component_image(full_command: list[str], env_vars=None) -> int:
        # kfp.local put this Python in place of the image's `python3`: put it back.
        argv = [part.replace(sys.executable, "python3") for part in full_command]
        env = {k: v for k, v in os.environ.items() if k.startswith("GPT_")}
        env["KUBECONFIG"] = str(kube / "config")
        spec = tmp_path / f"step-{len(steps)}.json"
        steps.append(spec)
        mounts = {str(tmp_path): tmp_path}
        command = container_command(component, spec, argv, {**env, **(env_vars or {})}, mounts,
                                    component.own_identity(), component.workdir)  # fmt: skip
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(done.stdout)
        return done.returncode

    monkeypatch.setattr(subprocess_task_handler, "run_local_subprocess", in_component_image)
    # KFP's launcher makes a step's output folders as the step's user; kfp.local makes them
    # here, as root: writable by all, so the image's user can write its outputs there.
    tmp_path.chmod(0o755)
    (tmp_path / "kfp").mkdir()
    (tmp_path / "kfp").chmod(0o777)
    old_umask = os.umask(0)
    try:
        local.init(runner=local.SubprocessRunner(use_venv=False),
                   pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)  # fmt: skip
        pipeline = components.load_component_from_file(str(compiled))
        with unresolved_run_id():
            pipeline(backend="trainjob", root="/gpt", **TINY_PIPELINE)
    finally:
        os.umask(old_umask)

    assert len(steps) == len(STAGES)  # every step ran in the component image
    runs = trainer_cluster.runs
    assert sorted(r.trainjob["metadata"]["labels"]["gpt-trainjobs/stage"] for r in runs.values()) \
        == sorted(STAGES)
    for name, run in runs.items():
        assert run.error is None and len(run.pods) == 1, name
        pod = run.pods[0]
        assert pod.proc.returncode == 0, pod.log
        assert json.loads((pod.folder / "container.json").read_text())["uid"] == 1000
    rundir = tmp_path / "pvc" / RUN_ID
    for rel in ("data/meta.json", "model/model.safetensors", "metrics/train.jsonl",
                "prompt/transcript.jsonl"):  # fmt: skip
        assert (rundir / rel).is_file(), rel
    assert owners(rundir) == {(1000, 1000)}
    outputs = {p.parent.name: p for p in (tmp_path / "kfp").rglob("executor_output.json")}
    assert set(outputs) == set(STAGES)
    assert {p.stat().st_uid for p in outputs.values()} == {1000}  # written by the step's user
    transcript = (outputs["generative-prompt"].parent / "transcript").read_text()
    assert "> To be" in transcript and "> or not" in transcript

    # The export, as a user loads it: transformers in the workload image, from the volume.
    script = ("import sys, torch, transformers as t; "
              "m = t.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
              "print(type(m).__name__, m(torch.zeros(1, 4, dtype=torch.long)).logits.shape[-1])")
    load = run_in(image_rootfs[built.workload], ["python", "-c", script, f"/gpt/{RUN_ID}/model"],
                  tmp_path, mounts={"/gpt": tmp_path / "pvc"})  # fmt: skip
    assert load.returncode == 0, load.stdout + load.stderr
    config = json.loads((rundir / "model" / "config.json").read_text())
    assert load.stdout.split() == [config["architectures"][0], str(config["vocab_size"])]
