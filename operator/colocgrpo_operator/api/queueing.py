"""Which Kueue LocalQueue and WorkloadPriorityClass a job names, the way Kueue's own integrations read it.

Kueue's users label the job object itself: `kueue.x-k8s.io/queue-name` and `kueue.x-k8s.io/priority-class`
on the ColocGRPOJob. The operator copies both onto the batch Job it creates, which is what Kueue admits.
`spec.scheduling.queueName` and `spec.scheduling.workloadPriorityClassName` are deprecated aliases of the two
labels: they still work, give a warning (`colocgrpo validate`, an Event on the job, and the API server's
warning through the ValidatingAdmissionPolicy of `queue_policies`), and a job whose label and field name
different values is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colocgrpo_operator.api.admission import policy_and_binding
from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import KUEUE_PRIORITY_CLASS_LABEL, KUEUE_QUEUE_LABEL, PLURAL

# (label, the deprecated spec field of the same meaning: its path, and its key under spec.scheduling).
QUEUE_SETTINGS = (
    (KUEUE_QUEUE_LABEL, "spec.scheduling.queueName", "queueName"),
    (KUEUE_PRIORITY_CLASS_LABEL, "spec.scheduling.workloadPriorityClassName", "workloadPriorityClassName"),
)
# The policies (and bindings) below, named <prefix><suffix>: one refuses a conflict, one warns of a
# deprecated field.
QUEUE_CONFLICT_POLICY = "-kueue-labels"
QUEUE_DEPRECATION_POLICY = "-kueue-fields"


def deprecation_message(label: str) -> str:
    return f"deprecated: put the label {label} on the ColocGRPOJob instead (Kueue's convention)"


def conflict_message(label: str, path: str) -> str:
    return f"the label {label} and {path} name different values; set only the label ({path} is deprecated)"


def _setting(labels: Mapping[str, Any], scheduling: Mapping[str, Any], label: str, key: str) -> Any:
    value = labels.get(label)
    return value if isinstance(value, str) and value else scheduling.get(key) or None


def resolved_queue(labels: Mapping[str, Any], scheduling: Mapping[str, Any]) -> str | None:
    """The LocalQueue: the job's `kueue.x-k8s.io/queue-name` label, else spec.scheduling.queueName.

    Args:
        labels: the job's metadata.labels.
        scheduling: its spec.scheduling, camelCase as on the wire.
    """
    value = _setting(labels, scheduling, KUEUE_QUEUE_LABEL, "queueName")
    return value if isinstance(value, str) else None


def resolved_priority_class(labels: Mapping[str, Any], scheduling: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass: the `kueue.x-k8s.io/priority-class` label, else
    spec.scheduling.workloadPriorityClassName."""
    value = _setting(labels, scheduling, KUEUE_PRIORITY_CLASS_LABEL, "workloadPriorityClassName")
    return value if isinstance(value, str) else None


def queue_problems(labels: Mapping[str, Any], scheduling: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A label and its deprecated field that name different values: (field path, message) pairs."""
    problems = []
    for label, path, key in QUEUE_SETTINGS:
        value, field = labels.get(label), scheduling.get(key)
        if value and field and value != field:
            problems.append((f"metadata.labels.{label}", conflict_message(label, path)))
    return problems


def queue_warnings(scheduling: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The deprecated fields the spec sets: (field path, message) pairs."""
    return [(path, deprecation_message(label)) for label, path, key in QUEUE_SETTINGS if scheduling.get(key)]


def _scheduling(job: ColocGRPOJob) -> dict[str, Any]:
    return job.spec.scheduling.model_dump(by_alias=True, exclude_none=True)


def job_queue(job: ColocGRPOJob) -> str | None:
    """`resolved_queue` of a validated job."""
    return resolved_queue(job.metadata.labels, _scheduling(job))


def job_priority_class(job: ColocGRPOJob) -> str | None:
    """`resolved_priority_class` of a validated job."""
    return resolved_priority_class(job.metadata.labels, _scheduling(job))


def job_warnings(job: ColocGRPOJob) -> list[tuple[str, str]]:
    """What a valid job should change, though it runs: (field path, message) pairs."""
    return queue_warnings(_scheduling(job))


# ----------------------------------------------------------------------------- the API server's side


def _scheduling_has(key: str) -> str:
    return f"has(object.spec.scheduling) && has(object.spec.scheduling.{key})"


def _label(label: str) -> str:
    return f"object.metadata.labels['{label}']"


def queue_policies(prefix: str = "colocgrpo") -> list[dict[str, Any]]:
    """Two ValidatingAdmissionPolicies with their bindings (cluster-scoped, named `prefix` + the
    suffixes above): one refuses a ColocGRPOJob whose Kueue label and deprecated field disagree (the
    operator refuses it too, `queue_problems`), one warns of a deprecated field on every create and
    update (the warning `kubectl apply` prints; CEL in the CRD can only refuse, never warn)."""
    conflicts = []
    warnings = []
    for label, path, key in QUEUE_SETTINGS:
        conflicts.append(
            {
                "expression": f"!({_scheduling_has(key)}) || !has(object.metadata.labels) "
                f"|| !('{label}' in object.metadata.labels) || {_label(label)} == object.spec.scheduling.{key}",
                "message": conflict_message(label, path),
                "reason": "Invalid",
            }
        )
        warnings.append(
            {"expression": f"!({_scheduling_has(key)})", "message": f"{path}: {deprecation_message(label)}"}
        )
    return [
        *policy_and_binding(prefix + QUEUE_CONFLICT_POLICY, ["CREATE", "UPDATE"], PLURAL, {"validations": conflicts}),
        *policy_and_binding(
            prefix + QUEUE_DEPRECATION_POLICY, ["CREATE", "UPDATE"], PLURAL, {"validations": warnings}, "Warn"
        ),
    ]
