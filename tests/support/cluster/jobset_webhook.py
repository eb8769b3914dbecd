"""JobSet's admission webhook, the part of it that refuses a JobSet for its names.

kubernetes-sigs/jobset at v0.12.0 (the JobSet Kubeflow Trainer v2.3.0 pins in its go.mod),
`pkg/webhooks/jobset_webhook.go`, as a pure function of the JobSet Trainer applies:
- `Default` (webhook `mjobset.kb.io`) makes every replicatedJob's Job Indexed when it says
  nothing; the CRD defaults `groupName` to `default` (api/jobset/v1alpha2/jobset_types.go);
- `ValidateCreate` (webhook `vjobset.kb.io`, failurePolicy Fail) requires `spec.network.subdomain`,
  when set, to be a DNS-1123 subdomain and a DNS-1035 label, and per replicatedJob its
  `groupName`, its longest Job name `<jobset>-<rjob>-<replicas-1>` (`placement.GenJobName`) and,
  for an Indexed Job with completions, its longest pod name
  `<jobset>-<rjob>-<replicas-1>-<completions-1>-abcde` (`placement.GenPodName` plus the
  5-character random suffix) to be DNS-1035 labels. A too-long name gets its own message; the
  pod-name error reports the longest *Job* name as the invalid value, as upstream does.
- `invalidError` answers `apierrors.NewInvalid` (422): `JobSet.jobset.x-k8s.io "<name>" is
  invalid: <errors>`, which the API server prefixes with the webhook's name
  (k8s.io/apiserver pkg/admission/plugin/webhook/errors/statuserror.go).

- `validateFailurePolicy`: each failure-policy rule (its empty name defaulted by `Default` to
  `failurePolicyRule<i>`) has a name of 1-128 characters matching `ruleNameFmt`, unique; its
  targetReplicatedJobs exist; its onJobFailureReasons are Job failure reasons JobSet knows; the
  RestartJob actions need the RestartJob feature gate (alpha, off by default,
  pkg/features/features.go).

The other checks of `ValidateCreate` (coordinator, volumeClaimPolicies, dependsOn) look at
fields no runtime of this project sets; a JobSet that sets them is refused here as not modelled
rather than admitted unchecked.
"""

from __future__ import annotations

import re
from typing import Any

# k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1035Label, IsDNS1123Subdomain,
# MaxLenError, RegexError (its examples and their double space included).
DNS1035_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
DNS1035_FORMAT = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_FORMAT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
# jobset_webhook.go: what replaces "must be no more than 63 characters" per name.
JOB_NAME_TOO_LONG = (
    "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
)
POD_NAME_TOO_LONG = (
    "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
)
GROUP_NAME_TOO_LONG = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters"
SUBDOMAIN_TOO_LONG = ".spec.network.subdomain is too long, must be less than 63 characters"
# The `name=` of the validating webhook's kubebuilder marker: what the API server's refusal names.
WEBHOOK = "vjobset.kb.io"


def _max_len(limit: int) -> str:
    return f"must be no more than {limit} characters"


def _dns1035(value: str) -> list[str]:
    errors = [_max_len(DNS1035_MAX)] if len(value) > DNS1035_MAX else []
    return errors + ([] if _DNS1035.match(value) else [DNS1035_FORMAT])


def _dns1123_subdomain(value: str) -> list[str]:
    errors = [_max_len(DNS1123_SUBDOMAIN_MAX)] if len(value) > DNS1123_SUBDOMAIN_MAX else []
    return errors + ([] if _DNS1123_SUBDOMAIN.match(value) else [DNS1123_SUBDOMAIN_FORMAT])


def _invalid(path: str, value: str, detail: str) -> str:
    """k8s.io/apimachinery pkg/util/validation/field/errors.go: `field.Invalid(...).Error()`."""
    return f'{path}: Invalid value: "{value}": {detail}'


def _as_label(path: str, value: str, too_long: str, reported: str | None = None) -> list[str]:
    """IsDNS1035Label's errors of `value`, the length one replaced by the webhook's own message,
    each naming `reported` (default: `value`) as the invalid value."""
    return [_invalid(path, reported or value, too_long if m == _max_len(DNS1035_MAX) else m)
            for m in _dns1035(value)]  # fmt: skip


# jobset_webhook.go validOnJobFailureReasons (k8s.io/api batch/v1 JobReason*) and ruleNameFmt.
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                       "MaxFailedIndexesExceeded", "PodFailurePolicy")  # fmt: skip
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def _failure_policy_errors(spec: dict[str, Any]) -> list[str]:
    rules = (spec.get("failurePolicy") or {}).get("rules") or []
    errors = []
    if any(r["action"] in ("RestartJob", "RestartJobAndIgnoreMaxRestarts") for r in rules):
        return ["RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not "
                "allowed when RestartJob feature gate is disabled"]  # fmt: skip
    rjobs = {rjob["name"] for rjob in spec["replicatedJobs"]}
    names: dict[str, list[int]] = {}
    for index, rule in enumerate(rules):
        name = rule.get("name") or f"failurePolicyRule{index}"
        if not 1 <= len(name) <= 128:
            errors.append(f"invalid failure policy rule name of length {len(name)}, the rule "
                          "name must be at least 1 characters long and at most 128 characters "
                          "long")  # fmt: skip
        names.setdefault(name, []).append(index)
        if not _RULE_NAME.match(name):
            errors.append(f"invalid failure policy rule name '{name}', a failure policy rule "
                          "name must start with an alphabetic character, optionally followed by "
                          "a string of alphanumeric characters or '_,:', and must end with an "
                          "alphanumeric character or '_'")  # fmt: skip
        errors += [f"invalid replicatedJob name '{r}' in failure policy does not appear in "
                   ".spec.ReplicatedJobs" for r in rule.get("targetReplicatedJobs") or []
                   if r not in rjobs]  # fmt: skip
        errors += [f"invalid job failure reason '{r}' in failure policy is not a recognized job "
                   "failure reason" for r in rule.get("onJobFailureReasons") or []
                   if r not in JOB_FAILURE_REASONS]  # fmt: skip
    # Go's `%v` of an []int: [0 1].
    errors += [f"rule names are not unique, rules with indices [{' '.join(map(str, indices))}] "
               f"all have the same name '{name}'" for name, indices in names.items()
               if len(indices) > 1]  # fmt: skip
    return errors


def _unmodelled(spec: dict[str, Any]) -> list[str]:
    found = [key for key in ("coordinator", "volumeClaimPolicies") if spec.get(key)]
    if any(rjob.get("dependsOn") for rjob in spec["replicatedJobs"]):
        found.append("dependsOn")
    return found


def validate_create(jobset: dict[str, Any]) -> list[str]:
    """The field errors `ValidateCreate` finds in the names of `jobset` (after `Default`)."""
    name, spec = jobset["metadata"]["name"], jobset["spec"]
    if unmodelled := _unmodelled(spec):
        raise NotImplementedError(f"the test cluster's JobSet webhook does not check {unmodelled}")
    errors = []
    if subdomain := (spec.get("network") or {}).get("subdomain"):
        path = "spec.network.subdomain"
        errors += [_invalid(path, subdomain, m) for m in _dns1123_subdomain(subdomain)]
        errors += _as_label(path, subdomain, SUBDOMAIN_TOO_LONG)
    for i, rjob in enumerate(spec["replicatedJobs"]):
        path = f"spec.replicatedJobs[{i}]"
        errors += _as_label(f"{path}.groupName", rjob.get("groupName", "default"),
                            GROUP_NAME_TOO_LONG)  # fmt: skip
        replicas = int(rjob.get("replicas", 1))
        longest_job = f"{name}-{rjob['name']}-{replicas - 1}"
        errors += _as_label(f"{path}.name", longest_job, JOB_NAME_TOO_LONG)
        job_spec = rjob["template"]["spec"]
        indexed = job_spec.get("completionMode", "Indexed") == "Indexed"  # mjobset's default
        if indexed and job_spec.get("completions") is not None:
            longest_pod = f"{longest_job}-{int(job_spec['completions']) - 1}-abcde"
            errors += _as_label(f"{path}.name", longest_pod, POD_NAME_TOO_LONG, longest_job)
    return errors + _failure_policy_errors(spec)


def admission_error(jobset: dict[str, Any]) -> str | None:
    """The API server's refusal of `jobset` (the error Trainer's Apply returns), or None."""
    # k8s.io/apimachinery field.ErrorList.ToAggregate drops repeated messages; an aggregate of
    # one is that error, of more `[a, b]` (util/errors/errors.go).
    errors = list(dict.fromkeys(validate_create(jobset)))
    if not errors:
        return None
    aggregate = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    invalid = f'JobSet.jobset.x-k8s.io "{jobset["metadata"]["name"]}" is invalid: {aggregate}'
    return f'admission webhook "{WEBHOOK}" denied the request: {invalid}'
