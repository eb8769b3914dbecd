"""What Kubeflow Trainer v2.3 and JobSet make of a TrainJob: its nodes' container and policies.

Pure functions of the TrainJob and its ClusterTrainingRuntime, so a test can check the rendering
without running anything. Each rule names the upstream file it follows (kubeflow/trainer at tag
v2.3.0, kubernetes-sigs/jobset at main, kubernetes/kubernetes for the Job controller).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

# kubeflow/trainer pkg/constants/constants.go: LabelTrainJobAncestor, AncestorTrainer, Node,
# ContainerTrainerPort, JobCompletionIndexFieldPath.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
NODE = "node"
TRAINER_PORT = 29500
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# kubernetes pkg/controller/job/job_controller.go: a Job's backoffLimit defaults to 6.
DEFAULT_BACKOFF_LIMIT = 6
# kubeflow/trainer v2.3.0 pkg/features/features.go: the alpha gate (default off) that registers
# the TrainJobStatus plugin (pkg/runtime/framework/plugins/registry.go) and starts the status
# server (cmd/trainer-controller-manager/main.go).
TRAINJOB_STATUS = "TrainJobStatus"
# pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go: what the plugin gives the
# trainer containers.
STATUS_ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
STATUS_ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
STATUS_ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
STATUS_MOUNT = "/var/run/secrets/kubeflow/trainer"
STATUS_VOLUME = "kubeflow-trainer-token"
STATUS_TOKEN_EXPIRY_S = 3600
# pkg/apis/config/v1alpha1/defaults.go: certManagement's webhookServiceName and statusServer's
# port; pkg/util/cert/cert.go: the operator's namespace where the controller's service-account
# namespace file is absent.
STATUS_SERVICE = "kubeflow-trainer-controller-manager"
OPERATOR_NAMESPACE = "kubeflow-system"
STATUS_PORT = 10443


@dataclass(frozen=True)
class Rendered:
    """One TrainJob as its JobSet: the trainer replicatedJob `node`, one Job of `num_nodes` pods."""

    name: str
    """The TrainJob's name, which is the JobSet's (and the headless service's, the subdomain)."""
    namespace: str
    num_nodes: int
    container: dict[str, Any]
    """The `node` container after the Trainer's merge: image, command, args, env, resources."""
    pod_spec: dict[str, Any]
    """The runtime's pod spec with that container in place (volumes, securityContext, ...)."""
    backoff_limit: int
    max_restarts: int | None
    """JobSet failurePolicy.maxRestarts; None: no failurePolicy (the first failed Job fails all)."""
    jobset: dict[str, Any]
    """The JobSet object the Trainer applies: named after the TrainJob, the runtime's template
    spec with the replicatedJob above (what JobSet's webhook judges, cluster/jobset_webhook.py)."""

    @property
    def failure_policy(self) -> dict[str, Any] | None:
        """The JobSet's failurePolicy (maxRestarts, rules), None if it has none."""
        return self.jobset["spec"].get("failurePolicy")

    @property
    def pod_failure_rules(self) -> list[dict[str, Any]]:
        """The Job's podFailurePolicy rules (none: every failed pod counts)."""
        job_spec = self.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
        return (job_spec.get("podFailurePolicy") or {}).get("rules") or []

    @property
    def master_addr(self) -> str:
        """The DNS name the torch plugin gives torchrun: node 0's pod in the JobSet's service."""
        return master_addr(self.name)


def master_addr(trainjob: str) -> str:
    # kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go (EnforceMLPolicy):
    # "%s-%s-0-0.%s" with the TrainJob name, `node`, the TrainJob name; it resolves because
    # JobSet gives every pod hostname <jobset>-<rjob>-<jobIndex>-<podIndex> and subdomain <jobset>
    # (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go: GetSubdomain).
    return f"{trainjob}-{NODE}-0-0.{trainjob}"


def _upsert_env(env: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kubeflow/trainer pkg/apply/apply.go UpsertEnvVars: replace by name, else append."""
    for item in new:
        env = _upsert(env, dict(item), "name")
    return env


def _upsert(items: list[dict[str, Any]], new: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """kubeflow/trainer pkg/apply/apply.go upsert: replace the item of the same `key`, else
    append (env and volumes by name, volume mounts by mountPath); a new list."""
    for i, item in enumerate(items):
        if item.get(key) == new[key]:
            return [*items[:i], new, *items[i + 1:]]
    return [*items, new]


def status_host() -> str:
    """Where trainjobstatus.go (createEnvVars) sends pods: `<webhookServiceName>.<operator
    namespace>.svc`, the service in front of the controller."""
    return f"{STATUS_SERVICE}.{OPERATOR_NAMESPACE}.svc"


def status_path(namespace: str, name: str) -> str:
    """pkg/statusserver/utils.go StatusUrl."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def token_audience(namespace: str, name: str) -> str:
    """pkg/statusserver/utils.go TokenAudience (TokenAudiencePrefix `trainer.kubeflow.org`)."""
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def tls_config_map(trainjob: str) -> str:
    """trainjobstatus.go (Build): the ConfigMap holding the status server's CA for a TrainJob."""
    return f"{trainjob}-tls-config"


def _trainjob_status(pod_spec: dict[str, Any], namespace: str, name: str) -> None:
    """trainjobstatus.go EnforceMLPolicy, for every TrainJob: each container of the trainer pod
    set gets the status server's URL and the paths of its CA and of a token, and the pod a
    projected volume of both, read-only at STATUS_MOUNT: a service-account token for the
    TrainJob's own audience, valid an hour, and the CA from the ConfigMap the plugin's Build
    copies from the webhook's Secret."""
    url = f"https://{status_host()}:{STATUS_PORT}{status_path(namespace, name)}"
    env = [
        {"name": STATUS_ENV_URL, "value": url},
        {"name": STATUS_ENV_CA_CERT, "value": f"{STATUS_MOUNT}/ca.crt"},
        {"name": STATUS_ENV_TOKEN, "value": f"{STATUS_MOUNT}/token"},
    ]
    mount = {"name": STATUS_VOLUME, "mountPath": STATUS_MOUNT, "readOnly": True}
    for container in pod_spec["containers"]:
        container["env"] = _upsert_env(container.get("env") or [], env)
        container["volumeMounts"] = _upsert(container.get("volumeMounts") or [], mount,
                                            "mountPath")  # fmt: skip
    volume = {"name": STATUS_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": token_audience(namespace, name),
                                 "expirationSeconds": STATUS_TOKEN_EXPIRY_S, "path": "token"}},
        {"configMap": {"name": tls_config_map(name),
                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]}}  # fmt: skip
    pod_spec["volumes"] = _upsert(pod_spec.get("volumes") or [], volume, "name")


def _cpus(resources: dict[str, Any]) -> int:
    """kubeflow/trainer torch.go getNumCPUPerNode: the CPU request, else the limit, rounded up
    (Quantity.Value)."""
    for kind in ("requests", "limits"):
        cpu = (resources.get(kind) or {}).get("cpu")
        if cpu is not None:
            text = str(cpu)
            return math.ceil(int(text[:-1]) / 1000 if text.endswith("m") else float(text))
    return 0


def _gpus(resources: dict[str, Any]) -> int:
    for kind in ("limits", "requests"):
        gpus = (resources.get(kind) or {}).get("nvidia.com/gpu")
        if gpus is not None:
            return int(gpus)
    return 0


def trainer_replicated_job(runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's replicatedJob labelled as the trainer ancestor (the only one this cluster
    runs: initializers and MPI launchers are not emulated)."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    trainers = [
        j for j in jobs
        if ((j["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        == ANCESTOR_TRAINER
    ]  # fmt: skip
    if len(jobs) != 1 or len(trainers) != 1:
        raise NotImplementedError("the test cluster runs runtimes of one trainer replicatedJob")
    return trainers[0]


def render(trainjob: dict[str, Any], runtime: dict[str, Any],
           feature_gates: frozenset[str] = frozenset()) -> Rendered:  # fmt: skip
    """The JobSet the Trainer would create for `trainjob` on `runtime`, with the Trainer's
    `feature_gates` that are on."""
    spec_trainer = trainjob["spec"].get("trainer") or {}
    rjob = copy.deepcopy(trainer_replicated_job(runtime))
    job_spec = rjob["template"]["spec"]
    pod_spec = job_spec["template"]["spec"]
    (container,) = [c for c in pod_spec["containers"] if c["name"] == NODE]

    # kubeflow/trainer pkg/runtime/framework/plugins/jobset/builder.go (Builder.Trainer):
    # image, command and args of container `node` are replaced when the TrainJob sets them;
    # the TrainJob's env is upserted into the runtime's.
    for key in ("image", "command", "args"):
        if spec_trainer.get(key) is not None:
            container[key] = list(spec_trainer[key]) if key != "image" else spec_trainer[key]
    container["env"] = _upsert_env(container.get("env") or [], spec_trainer.get("env") or [])

    # kubeflow/trainer pkg/runtime/core/trainingruntime.go (newRuntimeInfo): resourcesPerNode
    # is merged over the container's resources (MergeResourceRequirements, key by key).
    resources = copy.deepcopy(container.get("resources") or {})
    for kind, values in (spec_trainer.get("resourcesPerNode") or {}).items():
        resources[kind] = {**(resources.get(kind) or {}), **values}
    container["resources"] = resources

    # torch.go (EnforceMLPolicy): numNodes from the TrainJob, else the runtime's mlPolicy;
    # numProcPerNode from the TrainJob, else "auto": with no GPU, the node's whole CPUs.
    policy = runtime["spec"].get("mlPolicy") or {}
    num_nodes = int(spec_trainer.get("numNodes") or policy.get("numNodes") or 1)
    nproc = spec_trainer.get("numProcPerNode")
    if nproc is None:
        nproc = "auto" if _gpus(resources) else max(1, _cpus(resources))
    if "torch" in policy:
        container["env"] = _upsert_env(container["env"], [
            {"name": "PET_NNODES", "value": str(num_nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
            {"name": "PET_MASTER_ADDR", "value": master_addr(trainjob["metadata"]["name"])},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
        ])  # fmt: skip

    if TRAINJOB_STATUS in feature_gates:
        _trainjob_status(pod_spec, trainjob["metadata"]["namespace"], trainjob["metadata"]["name"])

    # kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go: failurePolicy.maxRestarts
    # (0 when the policy is set without it); no failurePolicy: any failed Job fails the JobSet.
    failure_policy = runtime["spec"]["template"]["spec"].get("failurePolicy")
    # kubeflow/trainer v2.3.0 plugins/jobset/builder.go (Trainer): one replica of the trainer Job;
    # plugins/jobset/jobset.go (SyncParallelCount): its parallelism and completions are the
    # trainer PodSet's count, numNodes.
    rjob["replicas"] = 1
    job_spec["parallelism"] = job_spec["completions"] = num_nodes
    meta = trainjob["metadata"]
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {**copy.deepcopy(runtime["spec"]["template"]["spec"]), "replicatedJobs": [rjob]},
    }
    return Rendered(
        name=trainjob["metadata"]["name"],
        namespace=trainjob["metadata"]["namespace"],
        num_nodes=num_nodes,
        container=container,
        pod_spec=pod_spec,
        backoff_limit=int(job_spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)),
        max_restarts=None if failure_policy is None else int(failure_policy.get("maxRestarts", 0)),
        jobset=jobset,
    )
