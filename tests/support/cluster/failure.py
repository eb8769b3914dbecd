"""How a failed pod ends its Job, and a failed Job its JobSet: the two failure policies.

Pure functions over the rendered JobSet (cluster/render.py) and what a pod left behind, so the
controller (cluster/controller.py) only acts on the verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# kubernetes staging/src/k8s.io/api/batch/v1/types.go: the Job's Failed condition reasons, and
# pkg/controller/job/job_controller.go's message for the backoff limit.
BACKOFF_LIMIT_EXCEEDED = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
POD_FAILURE_POLICY = "PodFailurePolicy"
# kubernetes-sigs/jobset v0.12.0 pkg/constants/constants.go.
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
FAIL_JOBSET = ("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")


@dataclass(frozen=True)
class PodFailure:
    """What the Job controller reads of a failed pod: its namespace/name, container `node`'s
    exit code and the pod's True conditions (DisruptionTarget for a preempted or evicted pod)."""

    namespace: str
    name: str
    exit_code: int
    conditions: frozenset[str] = frozenset()


def match_pod_failure_policy(rules: list[dict[str, Any]], pod: PodFailure) -> tuple[str, str]:
    """(action, message): the first rule the failed pod matches, ("Count", "") if none.

    kubernetes pkg/controller/job/pod_failure_policy.go (matchPodFailurePolicy): rules in
    order; `onExitCodes` matches a terminated container (named, or any) whose non-zero exit
    code is In / NotIn the values; `onPodConditions` a condition of that type and status
    (default "True"). FailJob's message names the container or the condition and the rule's
    index. The runtimes have one container, `node`, and no init containers.
    """
    for index, rule in enumerate(rules):
        action = rule["action"]
        if exit_codes := rule.get("onExitCodes"):
            if exit_codes.get("containerName", "node") != "node" or pod.exit_code == 0:
                continue
            inside = pod.exit_code in exit_codes["values"]
            if inside == (exit_codes["operator"] == "In"):
                return action, (
                    f"Container node for pod {pod.namespace}/{pod.name} failed with exit code "
                    f"{pod.exit_code} matching {action} rule at index {index}"
                )
        else:
            for pattern in rule.get("onPodConditions") or []:
                if pattern.get("status", "True") == "True" and pattern["type"] in pod.conditions:
                    return action, (
                        f"Pod {pod.namespace}/{pod.name} has condition {pattern['type']} "
                        f"matching {action} rule at index {index}"
                    )
    return "Count", ""


def jobset_verdict(
    failure_policy: dict[str, Any] | None, reason: str, restarts: int, job: str
) -> tuple[str, str, str]:
    """What JobSet does when its Job `job` failed with `reason`, after `restarts` restarts that
    counted: ("Restart", counts, "") or ("Failed", reason, message).

    kubernetes-sigs/jobset v0.12.0 pkg/controllers/failure_policy.go (executeFailurePolicy): no
    failurePolicy fails the JobSet (FailedJobs); else the first rule whose onJobFailureReasons
    (empty: any) holds the Job's failure reason acts (onJobFailureMessagePatterns and
    targetReplicatedJobs are not used by the runtimes and not modelled), no rule: RestartJobSet.
    RestartJobSet past maxRestarts fails (ReachedMaxRestarts); RestartJobSetAndIgnoreMaxRestarts
    restarts without counting. Messages name the Job (messageWithFirstFailedJob).
    """

    def failed(what: tuple[str, str]) -> tuple[str, str, str]:
        return "Failed", what[0], f"{what[1]} (first failed job: {job})"

    if failure_policy is None:
        return failed(FAILED_JOBS)
    action = "RestartJobSet"
    for rule in failure_policy.get("rules") or []:
        if not rule.get("onJobFailureReasons") or reason in rule["onJobFailureReasons"]:
            action = rule["action"]
            break
    if action == "FailJobSet":
        return failed(FAIL_JOBSET)
    if action == "RestartJobSetAndIgnoreMaxRestarts":
        return "Restart", "uncounted", ""
    if action != "RestartJobSet":
        raise NotImplementedError(f"JobSet failure policy action {action}")
    if restarts >= int(failure_policy.get("maxRestarts", 0)):
        return failed(MAX_RESTARTS)
    return "Restart", "counted", ""
