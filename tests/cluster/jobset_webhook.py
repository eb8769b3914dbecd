"""JobSet's admission webhook, the part of it that refuses a JobSet for its names.

kubernetes-sigs/jobset at v0.12.0 (the JobSet Kubeflow Trainer v2.3.0 pins in its go.mod),
`pkg/webhooks/jobset_webhook.go`:
- `Default` (webhook `mjobset.kb.io`) makes every replicatedJob's Job Indexed when it says nothing;
- `ValidateCreate` (webhook `vjobset.kb.io`, failurePolicy Fail) requires, per replicatedJob, the
  longest Job name `<jobset>-<rjob>-<replicas-1>` (`placement.GenJobName`) and, for an Indexed Job
  with completions, the longest pod name `<jobset>-<rjob>-<replicas-1>-<completions-1>-abcde`
  (`placement.GenPodName` plus the 5-character random suffix) to be DNS-1035 labels. A too-long
  name gets its own message; the pod-name error reports the longest *Job* name as the invalid
  value, as upstream does.

Kubeflow Trainer names the JobSet after the TrainJob, with one replicatedJob `node` of 1 replica
whose completions and parallelism are numNodes (`pkg/runtime/framework/plugins/jobset/jobset.go`).
"""

from __future__ import annotations

import re

# k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1035Label.
DNS1035_MAX = 63
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_FORMAT = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
JOB_NAME_TOO_LONG = (
    "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
)
POD_NAME_TOO_LONG = (
    "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
)
# The `name=` of the validating webhook's kubebuilder marker: what the API server's refusal names.
WEBHOOK = "vjobset.kb.io"


def _dns1035_errors(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1035_MAX:
        errors.append(f"must be no more than {DNS1035_MAX} characters")
    if not _DNS1035.match(value):
        errors.append(_DNS1035_FORMAT)
    return errors


def name_errors(jobset: str, rjob: str, replicas: int, completions: int | None) -> list[str]:
    """What `ValidateCreate` says of the names of one replicatedJob (Indexed, as defaulted)."""
    errors = []
    longest_job = f"{jobset}-{rjob}-{replicas - 1}"
    for message in _dns1035_errors(longest_job):
        message = JOB_NAME_TOO_LONG if "no more than" in message else message
        errors.append(f'spec.replicatedJobs[0].name: Invalid value: "{longest_job}": {message}')
    if completions is not None:
        longest_pod = f"{longest_job}-{completions - 1}-abcde"
        for message in _dns1035_errors(longest_pod):
            message = POD_NAME_TOO_LONG if "no more than" in message else message
            errors.append(f'spec.replicatedJobs[0].name: Invalid value: "{longest_job}": {message}')
    return errors


def admission_error(jobset: str, rjob: str, num_nodes: int) -> str | None:
    """The API server's refusal of the JobSet Trainer creates for a TrainJob, or None."""
    errors = name_errors(jobset, rjob, replicas=1, completions=num_nodes)
    if not errors:
        return None
    return f'admission webhook "{WEBHOOK}" denied the request: {"; ".join(errors)}'
