"""manifests/serve/inferenceservice.yaml on the test API server with KServe v0.20.0's CRDs, and
through KServe's admission (tests/support/cluster/kserve_webhook.py): a run's model, served by
KServe's Hugging Face runtime from the PVC the pipeline writes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from support.apiserver import namespace
from support.cluster.kserve_webhook import Refused, admit, pvc_mount
from support.paths import PROJECT

from components.trainjob.launcher import RUN_LABEL
from gpt.rundir.layout import RunDir

MANIFEST = PROJECT / "manifests" / "serve" / "inferenceservice.yaml"
CLAIM = PROJECT / "manifests" / "base" / "pvc.yaml"
KSERVE = Path("kserve-crds") / "v0.20.0"
RUN_ID = "6f1c2a9e-3b7d-4c1e-9a2f-0d4e5b6c7a8b"  # a KFP run id
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


def rendered(run: str) -> dict:
    """The manifest as `envsubst '$RUN'` renders it."""
    return yaml.safe_load(MANIFEST.read_text().replace("${RUN}", run))


@pytest.fixture(scope="module")
def kserve(kserve_api):
    """The test API server serving KServe's InferenceService CRD."""
    return kserve_api


@pytest.mark.apiserver
def test_a_runs_inferenceservice_is_admitted_and_serves_the_runs_model(kserve, shared):
    ns = namespace()
    isvc = rendered(RUN_ID)
    admit(isvc)
    created = kserve.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc)
    assert created["metadata"]["name"] == f"gpt-{RUN_ID}"
    assert created["metadata"]["labels"][RUN_LABEL] == RUN_ID  # as the run's TrainJobs
    model = created["spec"]["predictor"]["model"]
    # The claim the pipeline writes, and in it the run's model/ (the Hugging Face directory).
    claim, path = pvc_mount(model["storageUri"])
    assert claim == yaml.safe_load(CLAIM.read_text())["metadata"]["name"]
    assert Path("/gpt") / path == RunDir.of(Path("/gpt"), RUN_ID).model_dir
    # KServe's reference Hugging Face runtime takes this model format by itself (autoSelect).
    runtime = yaml.safe_load((shared / KSERVE / "reference-kserve-huggingfaceserver.yaml")
                             .read_text())  # fmt: skip
    formats = {f["name"]: f for f in runtime["spec"]["supportedModelFormats"]}
    assert formats[model["modelFormat"]["name"]]["autoSelect"] is True


def _broken(change) -> dict:
    isvc = copy.deepcopy(rendered(RUN_ID))
    change(isvc)
    return isvc


@pytest.mark.apiserver
def test_the_schema_refuses_a_model_without_a_format(kserve):
    from kubernetes.client.exceptions import ApiException

    isvc = _broken(lambda o: o["spec"]["predictor"]["model"].update(modelFormat={}))
    with pytest.raises(ApiException) as e:
        kserve.create_namespaced_custom_object(GROUP, VERSION, namespace(), PLURAL, isvc)
    assert e.value.status == 422 and "spec.predictor.model.modelFormat.name" in e.value.body


@pytest.mark.parametrize("change,message", [
    (lambda o: o["metadata"].update(name="7-gpt"), "must start with alphabetical character"),
    (lambda o: o["spec"]["predictor"]["model"].update(name="gpt"),
     "the 'name' field is not allowed in standard predictor"),
    (lambda o: o["spec"]["predictor"]["model"].update(env=[{"name": "PYTHONPATH", "value": "/x"}]),
     "setting PYTHONPATH in container \"\" is not allowed for security reasons"),
    (lambda o: o["spec"]["predictor"].update(huggingface={"storageUri": "pvc://gpt-pvc/x"}),
     "exactly one of [Name, SKLearn,"),
    (lambda o: o["spec"]["predictor"]["model"].update(storageUri="ftp://host/model"),
     "StorageUri [ftp://host/model] is not supported"),
    (lambda o: o["metadata"].update(annotations={"serving.kserve.io/autoscalerClass": "hpa2"}),
     "[hpa2] is not a supported autoscaler class type"),
])  # fmt: skip
def test_kserves_admission_refuses_what_upstream_refuses(change, message):
    with pytest.raises(Refused) as e:
        admit(_broken(change))
    assert message in str(e.value)


S3_MANIFEST = PROJECT / "manifests" / "serve" / "inferenceservice-s3.yaml"
EXPORT_URI, SECRET = "s3://gpt-models/runs/6f1c2a9e", "gpt-s3"


def rendered_s3(run: str) -> tuple[dict, dict]:
    """manifests/serve/inferenceservice-s3.yaml as `envsubst '$RUN $EXPORT_URI $SECRET'`
    renders it: its ServiceAccount and InferenceService."""
    text = S3_MANIFEST.read_text()
    for name, value in (("RUN", run), ("EXPORT_URI", EXPORT_URI), ("SECRET", SECRET)):
        text = text.replace("${" + name + "}", value)
    account, isvc = yaml.safe_load_all(text)
    return account, isvc


@pytest.mark.apiserver
def test_the_s3_inferenceservice_is_admitted_and_reads_the_export_with_kserves_credentials(kserve):
    account, isvc = rendered_s3(RUN_ID)
    admit(isvc)
    ns = namespace()
    created = kserve.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc)
    predictor = created["spec"]["predictor"]
    # The model comes from the pipeline's export_uri, as KServe's storage initializer reads it,
    assert predictor["model"]["storageUri"] == EXPORT_URI
    assert predictor["model"]["modelFormat"]["name"] == "huggingface"
    # with the credentials of KServe's convention: the predictor's ServiceAccount names the
    # Secret (whose annotations give the endpoint, docs/cluster.md).
    assert account["kind"] == "ServiceAccount"
    assert predictor["serviceAccountName"] == account["metadata"]["name"]
    assert account["secrets"] == [{"name": SECRET}]
    assert created["metadata"]["labels"][RUN_LABEL] == account["metadata"]["labels"][RUN_LABEL]


def test_the_pvc_and_s3_inferenceservices_differ_only_in_where_the_model_comes_from():
    _, s3 = rendered_s3(RUN_ID)
    pvc = rendered(RUN_ID)
    del s3["spec"]["predictor"]["serviceAccountName"]
    s3["spec"]["predictor"]["model"]["storageUri"] = pvc["spec"]["predictor"]["model"]["storageUri"]
    assert s3 == pvc
