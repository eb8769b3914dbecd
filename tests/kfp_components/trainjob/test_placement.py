"""Placement checked before anything is created: processes per GPU, and several nodes only on a
claim they can all mount (a ReadWriteOnce claim attaches to one node at a time)."""

from __future__ import annotations

import json

import pytest
from support.cluster import Claim

from components.step.dispatch import run_stage
from components.trainjob import claims, launcher
from components.trainjob.launcher import GROUP, PLURAL, VERSION, TrainJobSpec
from components.trainjob.placement import Placement


def test_processes_default_to_one_per_gpu_else_one():
    assert Placement().num_proc_per_node == 1
    assert Placement(gpus_per_node=8).num_proc_per_node == 8
    assert Placement(gpus_per_node=8, num_proc_per_node=4).num_proc_per_node == 4
    assert Placement(num_proc_per_node=3).num_proc_per_node == 3  # CPU processes


def test_more_processes_than_gpus_is_one_line():
    with pytest.raises(ValueError, match="num_proc_per_node 3: more processes than the 2 GPU"):
        Placement(gpus_per_node=2, num_proc_per_node=3)


def test_the_trainjob_asks_for_a_process_per_gpu():
    spec = TrainJobSpec(stage="train-gpt", runtime="gpt-train-gpt", image="i", command=["x"],
                        placement=Placement(num_nodes=2, gpus_per_node=4))  # fmt: skip
    trainer = launcher.build_trainjob(spec, "train-gpt-0a1b2c3d", "ns", "r")["spec"]["trainer"]
    assert trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 4}}


class Modes:
    def __init__(self, modes: list[str]) -> None:
        self.modes = modes

    def access_modes(self, namespace: str, claim: str) -> list[str]:
        return self.modes


def test_several_nodes_need_a_claim_every_node_can_mount():
    claims.check_multi_node(1, "ns", Modes(["ReadWriteOnce"]))  # one node: any claim
    claims.check_multi_node(2, "ns", Modes(["ReadWriteMany"]))
    for modes in (["ReadWriteOnce"], ["ReadWriteOncePod"], []):
        with pytest.raises(ValueError, match="num_nodes 2: PVC gpt-pvc in namespace ns is") as e:
            claims.check_multi_node(2, "ns", Modes(modes))
        assert "\n" not in str(e.value) and "ReadWriteMany" in str(e.value)


def test_a_missing_claim_is_one_line(tmp_path):
    with pytest.raises(claims.ClaimNotFound, match="PVC gpt-pvc not found in namespace ns"):
        claims.check_multi_node(2, "ns", claims.LogDirClaims(tmp_path))


SLEEP = ["python", "-c", "import time; print('started', flush=True); time.sleep(2)"]


@pytest.mark.apiserver
def test_a_readwriteonce_claim_attaches_to_one_node_at_a_time(trainer_cluster):
    # The rule itself, past the component's check: node 1's pod never starts its container.
    ns = trainer_cluster.namespace
    spec = TrainJobSpec(stage="train-gpt", runtime="gpt-train-gpt", image="i", command=SLEEP,
                        placement=Placement(num_nodes=2, timeout=4))  # fmt: skip
    with pytest.raises(launcher.TrainJobTimeout):
        launcher.launch(spec, ns, "r", say=lambda _: None)
    (run,) = trainer_cluster.runs.values()
    node0, node1 = run.pods
    assert "started" in node0.log and "started" not in node1.log
    events = [json.loads(p.read_text())
              for p in (trainer_cluster.kubelet.logs / ns / ".events").glob("*.json")]  # fmt: skip
    assert [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in events] == [
        (node1.name, "FailedAttachVolume",
         f'Multi-Attach error for volume "gpt-pvc" Volume is already used by pod(s) {node0.name}')
    ]  # fmt: skip


@pytest.mark.apiserver
def test_the_same_two_nodes_run_on_a_readwritemany_claim(trainer_cluster):
    ns = trainer_cluster.namespace
    folder = trainer_cluster.kubelet.claims[(ns, "gpt-pvc")].folder
    trainer_cluster.kubelet.bind(ns, "gpt-pvc", Claim(folder, ("ReadWriteMany",)))
    spec = TrainJobSpec(stage="train-gpt", runtime="gpt-train-gpt", image="i", command=SLEEP,
                        placement=Placement(num_nodes=2, timeout=30))  # fmt: skip
    outcome = launcher.launch(spec, ns, "r", say=lambda _: None)
    assert all("started" in p.log for p in trainer_cluster.runs[outcome.name].pods)


@pytest.mark.apiserver
def test_the_component_refuses_two_nodes_on_the_default_claim_before_creating_anything(
    trainer_cluster
):
    ns = trainer_cluster.namespace
    with pytest.raises(ValueError) as err:
        run_stage("train-gpt", {"root": "/gpt", "run": "r"}, Placement(num_nodes=2),
                  backend="trainjob", image="i", namespace=ns, say=lambda _: None)  # fmt: skip
    assert str(err.value).startswith(f"num_nodes 2: PVC gpt-pvc in namespace {ns} is ReadWriteOnce")
    assert trainer_cluster.api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)[
        "items"] == []  # fmt: skip
