"""KServe's storage credentials: the env its storage initializer gets from the predictor's
ServiceAccount and the Secrets it names, for an `s3://` storageUri.

kserve/kserve at v0.20.0, `pkg/credentials/`:
- `service_account_credentials.go` (CreateSecretVolumeAndEnv,
  CreateSecretVolumeAndEnvFromServiceAccount, mountSecretCredential): the ServiceAccount
  `serviceAccountName` (else `default`; none: no credentials); the Secret named by the
  InferenceService's `serving.kserve.io/storageSecretName` annotation, else each Secret the
  ServiceAccount lists; a Secret holding the S3 secret key is an S3 one;
- `s3/s3_secret.go` (BuildSecretEnvs) and `s3/utils.go` (BuildS3EnvVars, getEnvValue,
  getEndpointConfiguration): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the Secret's keys
  (config/configmap/inferenceservice.yaml's `credentials.s3` names them so), then from its
  annotations `serving.kserve.io/s3-*` (else its data of the variable's name): S3_ENDPOINT
  (without scheme), AWS_ENDPOINT_URL (with it: http:// where s3-usehttps is "0", else
  https://), S3_USE_HTTPS, S3_VERIFY_SSL, awsAnonymousCredential, AWS_DEFAULT_REGION.

The test API server has no core API: the ServiceAccounts and Secrets are a test's, given as the
objects' dicts (`data` base64 as the API holds it, or `stringData`). Other kinds of Secret (GCS,
Azure, HTTPS, HDFS, Hugging Face) and the IRSA annotation are not modelled.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

STORAGE_SECRET_ANNOTATION = "serving.kserve.io/storageSecretName"
ACCESS_KEY_ID, SECRET_ACCESS_KEY = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
# (variable, its annotation) in the order BuildS3EnvVars appends them, the endpoint's apart.
S3_ANNOTATED = (("S3_VERIFY_SSL", "s3-verifyssl"), ("awsAnonymousCredential",
                "s3-useanoncredential"), ("AWS_DEFAULT_REGION", "s3-region"),
                ("S3_USER_VIRTUAL_BUCKET", "s3-usevirtualbucket"),
                ("S3_USE_ACCELERATE", "s3-useaccelerate"), ("AWS_CA_BUNDLE", "s3-cabundle"),
                ("AWS_CA_BUNDLE_CONFIGMAP", "s3-cabundle-configmap"))  # fmt: skip


def secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    return {**data, **(secret.get("stringData") or {})}


def storage_env(isvc: Mapping[str, Any], accounts: Mapping[str, Mapping[str, Any]],
                secrets: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:  # fmt: skip
    """The storage initializer's credential env for `isvc`, from the ServiceAccounts and
    Secrets of its namespace (by name)."""
    predictor = isvc["spec"]["predictor"]
    account = accounts.get(predictor.get("serviceAccountName") or "default")
    if account is None:
        return {}  # "Failed to find service account": the pod goes without
    annotations = isvc["metadata"].get("annotations") or {}
    names = ([annotations[STORAGE_SECRET_ANNOTATION]] if STORAGE_SECRET_ANNOTATION in annotations
             else [ref["name"] for ref in account.get("secrets") or []])  # fmt: skip
    env: dict[str, str] = {}
    for name in names:
        if name not in secrets:
            raise AssertionError(f"Secret {name} is not in the test cluster (KServe's failure "
                                 "to find it is not modelled)")  # fmt: skip
        data = secret_data(secrets[name])
        if SECRET_ACCESS_KEY in data:
            env.update(s3_env(secrets[name], data))
    return env


def s3_env(secret: Mapping[str, Any], data: Mapping[str, str]) -> dict[str, str]:
    """BuildSecretEnvs: the keys, then BuildS3EnvVars."""
    annotations = secret.get("metadata", {}).get("annotations") or {}

    def value(variable: str, annotation: str) -> str:
        key = f"serving.kserve.io/{annotation}"
        return annotations[key] if key in annotations else data.get(variable, "")

    env = {ACCESS_KEY_ID: data.get(ACCESS_KEY_ID, ""), SECRET_ACCESS_KEY: data[SECRET_ACCESS_KEY]}
    endpoint = value("S3_ENDPOINT", "s3-endpoint").strip()
    if endpoint:
        lower = endpoint.lower()
        if lower.startswith("https://"):
            https, host, url = "1", endpoint[8:], endpoint
        elif lower.startswith("http://"):
            https, host, url = "0", endpoint[7:], endpoint
        else:
            https, host = value("S3_USE_HTTPS", "s3-usehttps"), endpoint
            url = f"http://{endpoint}" if https == "0" else f"https://{endpoint}"
        if https:
            env["S3_USE_HTTPS"] = https
        env["S3_ENDPOINT"], env["AWS_ENDPOINT_URL"] = host, url
    for variable, annotation in S3_ANNOTATED:
        if got := value(variable, annotation):
            env[variable] = got
    return env
