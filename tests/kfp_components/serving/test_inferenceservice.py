"""The deploy step's InferenceService (components/serving/inferenceservice.py): its name within
KServe v0.20.0's limits, the object admitted by KServe's CRD and admission, and its server-side
apply on the test API server (a re-run updates the same service). The API server's 404 (no
KServe) and 403 (RBAC), as the step says them: test_deploy_on_kserve.py."""

from __future__ import annotations

import re

import pytest
import yaml
from support.apiserver import namespace
from support.cluster.kserve_webhook import admit, pvc_mount
from support.paths import PROJECT

from components.serving.inferenceservice import (
    FIELD_MANAGER,
    GROUP,
    NAME_MAX,
    PLURAL,
    VERSION,
    Predictor,
    build_inferenceservice,
    name_limit,
    server_side_apply,
    service_name,
)
from components.trainjob.launcher import RUN_LABEL

RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id
PROFILE = "kubeflow-user-example-com"  # the platform's example profile namespace
MANIFEST = PROJECT / "manifests" / "serve" / "inferenceservice.yaml"


def test_a_run_id_that_fits_is_the_name_as_the_manifests_have_it():
    assert service_name(RUN_ID, "kubeflow") == f"gpt-{RUN_ID}"
    assert service_name("demo", PROFILE) == "gpt-demo"


@pytest.mark.parametrize("ns", ["kubeflow", PROFILE, "t" * 40])
@pytest.mark.parametrize("run", [RUN_ID, "My_Run.2", "x" * 200, "a", "-9-"])
def test_every_name_is_what_kserve_derives_valid_names_from(run, ns):
    name = service_name(run, ns)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)  # IsvcNameFmt
    assert len(f"isvc.{name}-predictor") <= 63  # the predictor's `app` label value
    assert len(f"{name}-predictor-{ns}") <= 63  # the predictor host's first DNS label
    assert service_name(run, ns) == name  # a re-run: the same service


def test_two_runs_get_two_names_even_where_they_are_cut_or_cleaned():
    long = "r" * 80
    assert service_name(long + "1", PROFILE) != service_name(long + "2", PROFILE)
    assert service_name("Run_1", "kubeflow") != service_name("run-1", "kubeflow")
    # A KFP run id in a profile namespace is too long as it is: cut, its hash appended.
    cut = service_name(RUN_ID, PROFILE)
    assert cut.startswith("gpt-6f1c2a9e-3b7d-") and len(cut) <= name_limit(PROFILE) == 27
    assert NAME_MAX == 48


def test_a_namespace_too_long_for_any_name_is_one_line():
    with pytest.raises(ValueError, match=r"^namespace 'n{41}': 41 characters leave no room"):
        service_name(RUN_ID, "n" * 41)


def test_the_pvc_service_is_the_hand_applied_manifest_made_by_the_step():
    """manifests/serve/inferenceservice.yaml (a person's `envsubst`) and the step's object
    differ in nothing but the namespace the step fills in."""
    made = build_inferenceservice(f"gpt-{RUN_ID}", "kubeflow", RUN_ID,
                                  Predictor(f"pvc://gpt-pvc/{RUN_ID}/model"))  # fmt: skip
    by_hand = yaml.safe_load(MANIFEST.read_text().replace("${RUN}", RUN_ID))
    assert made["metadata"].pop("namespace") == "kubeflow"
    assert made == by_hand


@pytest.mark.parametrize("predictor", [
    Predictor(f"pvc://gpt-pvc/{RUN_ID}/model"),
    Predictor("s3://models/runs/r1", service_account="gpt-s3"),
    Predictor(f"pvc://gpt-pvc/{RUN_ID}/model", gpus=2),
], ids=["pvc-cpu", "s3", "gpu"])  # fmt: skip
def test_every_service_the_step_writes_is_admitted_by_kserves_crd_and_webhook(kserve_api,
                                                                              predictor):
    ns = namespace()
    body = build_inferenceservice(service_name(RUN_ID, ns), ns, RUN_ID, predictor)
    admit(body)  # KServe's validating webhook, as the test cluster models it
    made = server_side_apply(kserve_api, body)  # the CRD's schema, on a real API server
    model = made["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "huggingface"}
    assert model["storageUri"] == predictor.storage_uri
    assert made["metadata"]["labels"][RUN_LABEL] == RUN_ID
    if predictor.gpus:  # vLLM, the runtime's default: no backend chosen, the GPUs asked
        assert "args" not in model and model["resources"]["limits"]["nvidia.com/gpu"] == "2"
    else:
        assert model["args"] == ["--backend=huggingface", "--dtype=float32"]
    if predictor.storage_uri.startswith("pvc://"):
        assert pvc_mount(model["storageUri"]) == ("gpt-pvc", f"{RUN_ID}/model")
    else:  # KServe's storage initializer takes the S3 keys from the ServiceAccount's Secret
        assert made["spec"]["predictor"]["serviceAccountName"] == "gpt-s3"


def test_a_re_apply_updates_the_same_service_and_the_step_owns_its_fields(kserve_api):
    ns = namespace()
    name = service_name(RUN_ID, ns)
    first = server_side_apply(kserve_api, build_inferenceservice(
        name, ns, RUN_ID, Predictor(f"pvc://gpt-pvc/{RUN_ID}/model")))
    again = server_side_apply(kserve_api, build_inferenceservice(
        name, ns, RUN_ID, Predictor(f"pvc://gpt-pvc/{RUN_ID}/model")))
    # The same object, unchanged: a retried step changes nothing.
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    assert again["metadata"]["generation"] == first["metadata"]["generation"] == 1
    # Another export of the same run: the same service, its spec updated.
    moved = server_side_apply(kserve_api, build_inferenceservice(
        name, ns, RUN_ID, Predictor("s3://models/r", service_account="gpt-s3")))
    assert moved["metadata"]["uid"] == first["metadata"]["uid"]
    assert moved["metadata"]["generation"] == 2
    assert moved["spec"]["predictor"]["model"]["storageUri"] == "s3://models/r"
    (managed,) = moved["metadata"]["managedFields"]
    assert (managed["manager"], managed["operation"]) == (FIELD_MANAGER, "Apply")
    listed = kserve_api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    assert [i["metadata"]["name"] for i in listed] == [name]
