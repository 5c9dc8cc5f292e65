"""What Kueue says about a job's batch Job: whether Kueue admits it, and why it waits.

Pure, like the rest of status derivation: views of the Job and of Kueue's Workloads in (the
operator watches Workloads read-only, kopf_glue/handlers.py), decisions out. docs/install.md
("Using Kueue") describes the behaviour these serve; tests/operator/test_kueue.py runs it
against Kueue's real manager.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api import KUEUE_QUEUE_LABEL
from colocgrpo_operator.api.naming import SUSPEND_REQUESTED_ANNOTATION
from colocgrpo_operator.controller.objects import dig, pods_of_job, truncate

SUSPEND_MESSAGE = (
    "suspended by spec.runPolicy.suspend: the Job is deleted so that Kueue releases its quota; "
    "resuming queues a new one"
)


# What `kueue_queue` names a Job that Kueue holds though it names no queue.
NO_QUEUE_NAME = "(none)"
NO_QUEUE_NAME_MESSAGE = (
    "Kueue holds the Job though the job names no queue (Kueue manages every Job of this namespace: "
    "manageJobsWithoutQueueName); create the ColocGRPOJob with the label kueue.x-k8s.io/queue-name=<LocalQueue>"
)


def kueue_queue(spec_queue: str | None, job: dict[str, Any] | None) -> str | None:
    """The Kueue LocalQueue that admits this job's Job, if any: the job's (its
    `kueue.x-k8s.io/queue-name` label, or spec.scheduling.queueName), or the one Kueue's webhook
    labelled the Job with (a namespace's LocalQueue named `default` takes every Job created without
    a queue name); NO_QUEUE_NAME for a Job suspended by someone else while the operator asked for it
    to run (Kueue's manageJobsWithoutQueueName suspends every Job of the namespaces it manages)."""
    label = dig(job, "metadata", "labels", KUEUE_QUEUE_LABEL)
    if spec_queue or (isinstance(label, str) and label):
        return spec_queue or label
    asked = dig(job, "metadata", "annotations", SUSPEND_REQUESTED_ANNOTATION)
    return NO_QUEUE_NAME if asked == "false" and dig(job, "spec", "suspend") is True else None


def workload_of(job: dict[str, Any] | None, workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """This very Job's Workload (by owner uid): a Workload of a deleted predecessor does not count."""
    owned = pods_of_job(job, workloads)  # owned by the Job's uid, as for its pods
    return owned[0] if owned else None


def _condition(workload: dict[str, Any], type_: str) -> dict[str, Any]:
    for condition in dig(workload, "status", "conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return {}


def kueue_wait(workload: dict[str, Any] | None) -> tuple[str, str]:
    """(reason, message) of why Kueue has not admitted the Job, from its Workload's
    QuotaReserved, Admitted and Evicted conditions."""
    if not isinstance(workload, dict):
        return (
            "WaitingForWorkload",
            "Kueue has not created a Workload for the Job yet (is Kueue running and managing this namespace?)",
        )
    name = dig(workload, "metadata", "name") or "?"
    reserved = _condition(workload, "QuotaReserved")
    evicted = _condition(workload, "Evicted")
    if _condition(workload, "Admitted").get("status") == "True":
        return "Admitted", f"Workload {name} is admitted; Kueue is starting the Job"
    if reserved.get("status") == "True":
        queue = dig(workload, "status", "admission", "clusterQueue") or "its ClusterQueue"
        return "WaitingForAdmissionChecks", f"Workload {name} has quota in {queue}; waiting for its admission checks"
    if not reserved:
        return "WaitingForScheduling", f"Workload {name} waits for Kueue's scheduler to consider it"
    why = str(reserved.get("message") or "waiting for quota")
    reason = "Inadmissible" if reserved.get("reason") == "Inadmissible" else "WaitingForQuota"
    if evicted.get("status") == "True":
        reason = "Evicted"
        cause = evicted.get("message") or evicted.get("reason") or "evicted"
        if why != cause:
            why = f"{cause}; {why}"
        why = f"evicted ({evicted.get('reason') or 'Evicted'}): {why}"
    return reason, truncate(f"Workload {name}: {why}")
