"""Thin kopf handlers: gather a job's inputs from the indices, let the Reconciler decide.

Importing this module registers every handler of the operator, the startup, login and cleanup
ones (kopf_glue/startup.py) included; `colocgrpo-operator` runs them.

Children are watched, not polled: kopf keeps three in-memory indices fed by one watch
stream per kind (server-side filtered by the `colocgrpo.io/job-name` label):
ColocGRPOJobs by (namespace, name), their batch Jobs and their pods by the same key.
Any event of a Job or pod re-reconciles the job it belongs to; one operator-wide re-check
loop (controller/housekeeping.py) covers stall detection and anything a dropped watch missed.
Where Kueue is installed, a fourth index holds the Workloads of batch Jobs (Kueue's objects carry
no label of ours), so a queued job's status can say why Kueue has not admitted it; without
Kueue's CRD, kopf serves that resource once the CRD appears, and its absence is one INFO line
(kopf_glue/kueue_watch.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from colocgrpo_operator.api import GROUP, JOB_NAME_LABEL, PLURAL, VERSION, spec_change_problems
from colocgrpo_operator.controller.record import RecordExtras
from colocgrpo_operator.controller.snapshots import (
    Key,
    batch_job_snapshot,
    drop_managed_fields,
    has_view,
    job_resource_snapshot,
    pack,
    pod_snapshot,
    workload_owner_job,
    workload_snapshot,
)
from colocgrpo_operator.kopf_glue import startup  # noqa: F401  (registers the startup, login and cleanup handlers)
from colocgrpo_operator.kopf_glue.event_refusals import install_event_refusal_filter
from colocgrpo_operator.kopf_glue.kueue_watch import KUEUE_WORKLOADS, install_absent_kueue_filter
from colocgrpo_operator.kopf_glue.runtime import runtime_of
from colocgrpo_operator.kopf_glue.startup import diffbase_of, digested
from colocgrpo_operator.metrics import JOB_METRICS

RESOURCE = (GROUP, VERSION, PLURAL)
CHILD_LABELS = {JOB_NAME_LABEL: kopf.PRESENT}

# Before kopf runs: its first discovery scan already names the Workloads when Kueue is absent.
install_absent_kueue_filter(logging.getLogger("colocgrpo.operator"))
install_event_refusal_filter()


# ----------------------------------------------------------------------------- indices


def job_key(namespace: str | None, name: str) -> Key:
    """(namespace, name) of one of the namespaced objects watched here (kopf types a namespace as
    optional for the sake of cluster-scoped kinds)."""
    return (namespace or "", name)


# Indexers are async (though they never await) because kopf runs sync callbacks in its thread
# pool: a thread hop per watch event would dominate the operator's CPU with hundreds of jobs.
# Their function names are the indices' names, which the startup handler receives them under.
# Each first drops the event's managedFields (snapshots.drop_managed_fields says why).


@kopf.index(*RESOURCE)
async def jobs_by_name(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, str]:
    """Every ColocGRPOJob, packed (controller/snapshots.py), by (namespace, name)."""
    drop_managed_fields(body)
    return {job_key(namespace, name): pack(job_resource_snapshot(body))}


@kopf.index("batch", "v1", "jobs", labels=CHILD_LABELS)
async def batch_jobs_by_owner(
    namespace: str | None, name: str, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, str] | None:
    """The gang's batch Job, packed, by its job's key (only the Job named after its job)."""
    drop_managed_fields(body)
    if labels.get(JOB_NAME_LABEL) != name:
        return None
    return {job_key(namespace, name): pack(batch_job_snapshot(body))}


@kopf.index("v1", "pods", labels=CHILD_LABELS)
async def pods_by_owner(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, str]:
    """Every pod labelled with a job's name, packed, by that job's key."""
    drop_managed_fields(body)
    return {job_key(namespace, labels[JOB_NAME_LABEL]): pack(pod_snapshot(body))}


@kopf.index(*KUEUE_WORKLOADS)
async def workloads_by_job(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Key, str] | None:
    """Kueue's Workloads of batch Jobs, packed, by (namespace, the Job's name): our Jobs are
    named after their job, and Kueue matches Workloads to Jobs by that name too."""
    drop_managed_fields(body)
    owner = workload_owner_job(body)
    return {job_key(namespace, owner): pack(workload_snapshot(body))} if owner else None


# ----------------------------------------------------------------------------- the job itself


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
async def reconcile_job(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    reason: Any,
    old: Any,
    new: Any,
    patch: kopf.Patch,
    **_: Any,
) -> None:
    """Validate, apply every child (idempotently) and derive status. Safe to run any number
    of times: on create, on every spec change, and for every job when the operator starts."""
    key = job_key(namespace, name)
    trigger = getattr(reason, "value", str(reason))
    ensure_children = True
    if trigger == "update" and old is not None and new is not None:
        # The CRD's CEL rules freeze a started job's spec, except trainerArgs (its untyped values
        # defeat CEL). A frozen field changed anyway is not rolled out: the running gang and its
        # ConfigMap keep what they started with, and the user is told which field.
        # kopf's old/new are the essence (no status); whether the job started is in the status.
        # Both essences digested alike: a diff-base an older operator wrote in full compares equal.
        started = {"status": dict(body.get("status") or {})}
        problems = spec_change_problems(dict(digested(old), **started), dict(digested(new), **started))
        if problems:
            ensure_children = False
            kopf.warn(
                body, reason="ImmutableField", message="; ".join(f"{path} {text}" for path, text in problems)[:1024]
            )
    runtime = runtime_of(memo)
    # A new job's kopf diff-base goes with its first record: one PATCH of the job instead of two,
    # and kopf has no patch of its own to wait for (docs/decisions.md says why that matters).
    diffbase = diffbase_of(memo)
    extras = None
    if trigger == "create" and new is not None and diffbase is not None:
        extras = RecordExtras(diffbase.annotations(body=body, essence=new))
    try:
        await runtime.reconciler.reconcile(
            key,
            runtime.indices.reader(key),
            trigger=trigger,
            ensure_children=ensure_children,
            fresh_cr=job_resource_snapshot(body),  # this very event's body is the freshest view
            record_extras=extras,
        )
    except BaseException:
        if extras is not None and extras.written and diffbase is not None:
            # kopf retries a failed handler only while the job has no diff-base: take it back
            # (kopf applies this patch with its retry state). The marker may stay.
            for annotation in diffbase.make_keys(diffbase.key, body=body):
                patch.metadata.annotations[annotation] = None
        raise
    if extras is not None and extras.written and diffbase is not None:
        diffbase.written(body=body, annotations=extras.annotations)
    runtime.reconciler.schedule.wake_up()  # a changed TTL or a finished job: let the clock look again


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("v1", "pods", labels=CHILD_LABELS)
async def child_changed(
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A Job or pod of some job changed (or vanished): re-derive that job's status, in a task
    of its own (Reconciler.reconcile_soon says why), so this handler returns at once."""
    key = job_key(namespace, labels.get(JOB_NAME_LABEL, ""))
    runtime = runtime_of(memo)
    if not has_view(runtime.indices.jobs, key):
        return  # an orphan, or a job being deleted: garbage collection handles it
    runtime.reconciler.reconcile_soon(key, runtime.indices.reader(key), trigger="child")


@kopf.on.event(*KUEUE_WORKLOADS)
async def workload_changed(namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Kueue changed (or deleted) a Workload: if it belongs to one of our Jobs, re-derive that
    job's status, in a task of its own like child_changed."""
    key = job_key(namespace, workload_owner_job(body) or "")
    runtime = runtime_of(memo)
    if not has_view(runtime.indices.jobs, key):
        return  # not one of ours
    runtime.reconciler.reconcile_soon(key, runtime.indices.reader(key), trigger="workload")


@kopf.on.event(*RESOURCE)
async def job_event(
    type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """Start the housekeeping loop with the first job seen (`OperatorRuntime.start_housekeeping`
    says why not at startup); forget deleted jobs (caches, phase gauge, per-job metrics); keep the
    per-job metrics at what every other event's status says (the trainer's progress reports reach
    the operator only as such events); derive the status again at once when someone else changed
    it (the trainer's token may patch the status subresource: the operator repairs anything but
    progress, and with the chart's admission policy such a write is refused in the first place).
    Everything else is handled above."""
    runtime = runtime_of(memo)
    runtime.start_housekeeping()
    key = job_key(namespace, name)
    if type == "DELETED":
        runtime.reconciler.forget(key)
        JOB_METRICS.forget(key)
        return
    JOB_METRICS.observe(key, body.get("status"))
    runtime.reconciler.steps.observe(key, body, datetime.now(UTC))  # the progress deadline's clock
    if type == "MODIFIED" and runtime.reconciler.ledger.status_drifted(key, body):
        runtime.reconciler.reconcile_soon(key, runtime.indices.reader(key), trigger="status")
