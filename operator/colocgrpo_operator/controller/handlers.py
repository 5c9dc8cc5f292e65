"""Thin kopf handlers: gather a job's inputs from the indices, let the Reconciler decide.

Children are watched, not polled: kopf keeps three in-memory indices fed by one watch
stream per kind (server-side filtered by the `colocgrpo.io/job-name` label):
ColocGRPOJobs by (namespace, name), their batch Jobs and their pods by the same key.
Any event of a Job or pod re-reconciles the job it belongs to; one operator-wide re-check
loop covers stall detection and anything a dropped watch missed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import kopf

from colocgrpo_operator.api import GROUP, JOB_NAME_LABEL, PLURAL, VERSION, spec_change_problems
from colocgrpo_operator.controller import settings as _settings
from colocgrpo_operator.controller.housekeeping import Housekeeper
from colocgrpo_operator.controller.reconciler import Inputs, Key, Reconciler
from colocgrpo_operator.controller.snapshots import (
    all_views,
    batch_job_snapshot,
    first_view,
    has_view,
    job_resource_snapshot,
    pack,
    pod_snapshot,
)

RESOURCE = (GROUP, VERSION, PLURAL)
CHILD_LABELS = {JOB_NAME_LABEL: kopf.PRESENT}
# Re-check period of active jobs (stall detection granularity; a safety net for missed events).
RECHECK_SECONDS = float(os.environ.get(_settings.ENV_ACTIVE_INTERVAL, "10"))


# ----------------------------------------------------------------------------- indices


# Indexers are async (though they never await) because kopf runs sync callbacks in its thread
# pool: a thread hop per watch event would dominate the operator's CPU with hundreds of jobs.


@kopf.index(*RESOURCE)
async def jobs_by_name(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, str]:
    return {(namespace, name): pack(job_resource_snapshot(body))}


@kopf.index("batch", "v1", "jobs", labels=CHILD_LABELS)
async def batch_jobs_by_owner(
    namespace: str, name: str, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, str] | None:
    # Only the Job named after its ColocGRPOJob is the gang.
    if labels.get(JOB_NAME_LABEL) != name:
        return None
    return {(namespace, name): pack(batch_job_snapshot(body))}


@kopf.index("v1", "pods", labels=CHILD_LABELS)
async def pods_by_owner(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, str]:
    return {(namespace, labels[JOB_NAME_LABEL]): pack(pod_snapshot(body))}


def _reader(
    key: Key, jobs_by_name: kopf.Index, batch_jobs_by_owner: kopf.Index, pods_by_owner: kopf.Index
) -> Callable[[], Inputs]:
    """Reads one job's inputs from the indices when called (on the event loop, so the
    indices cannot change while it decodes them)."""

    def read() -> Inputs:
        return first_view(jobs_by_name, key), first_view(batch_jobs_by_owner, key), all_views(pods_by_owner, key)

    return read


def _reconciler(memo: kopf.Memo) -> Reconciler:
    return memo.reconciler


# ----------------------------------------------------------------------------- the job itself


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
async def reconcile_job(
    namespace: str,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    reason: Any,
    old: Any,
    new: Any,
    jobs_by_name: kopf.Index,
    batch_jobs_by_owner: kopf.Index,
    pods_by_owner: kopf.Index,
    **_: Any,
) -> None:
    """Validate, apply every child (idempotently) and derive status. Safe to run any number
    of times: on create, on every spec change, and for every job when the operator starts."""
    key = (namespace, name)
    trigger = getattr(reason, "value", str(reason))
    ensure_children = True
    if trigger == "update" and old is not None and new is not None:
        # The CRD's CEL rules freeze a started job's spec, except trainerArgs (its untyped values
        # defeat CEL). A frozen field changed anyway is not rolled out: the running gang and its
        # ConfigMap keep what they started with, and the user is told which field.
        # kopf's old/new are the essence (no status); whether the job started is in the status.
        started = {"status": dict(body.get("status") or {})}
        problems = spec_change_problems(dict(old, **started), dict(new, **started))
        if problems:
            ensure_children = False
            kopf.warn(
                body, reason="ImmutableField", message="; ".join(f"{path} {text}" for path, text in problems)[:1024]
            )
    await _reconciler(memo).reconcile(
        key,
        _reader(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner),
        trigger=trigger,
        ensure_children=ensure_children,
        fresh_cr=job_resource_snapshot(body),  # this very event's body is the freshest view
    )
    _reconciler(memo).wake_up()  # a changed TTL or a finished job: let the clock look again


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("v1", "pods", labels=CHILD_LABELS)
async def child_changed(
    namespace: str,
    labels: kopf.Labels,
    memo: kopf.Memo,
    jobs_by_name: kopf.Index,
    batch_jobs_by_owner: kopf.Index,
    pods_by_owner: kopf.Index,
    **_: Any,
) -> None:
    """A Job or pod of some job changed (or vanished): re-derive that job's status, in a task
    of its own (Reconciler.reconcile_soon says why), so this handler returns at once."""
    key = (namespace, labels.get(JOB_NAME_LABEL, ""))
    if not has_view(jobs_by_name, key):
        return  # an orphan, or a job being deleted: garbage collection handles it
    _reconciler(memo).reconcile_soon(
        key, _reader(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner), trigger="child"
    )


@kopf.on.event(*RESOURCE)
async def job_event(
    type: str | None,
    namespace: str,
    name: str,
    memo: kopf.Memo,
    jobs_by_name: kopf.Index,
    batch_jobs_by_owner: kopf.Index,
    pods_by_owner: kopf.Index,
    **_: Any,
) -> None:
    """Start the housekeeping loop with the first job seen; forget deleted jobs (caches, phase
    gauge). Everything else is handled above."""
    _ensure_housekeeping(memo, jobs_by_name, batch_jobs_by_owner, pods_by_owner)
    if type == "DELETED":
        _reconciler(memo).forget((namespace, name))


# ----------------------------------------------------------------------------- the clock


def _ensure_housekeeping(
    memo: kopf.Memo, jobs_by_name: kopf.Index, batch_jobs_by_owner: kopf.Index, pods_by_owner: kopf.Index
) -> None:
    """Start, once, the operator-wide loop that re-checks active jobs every RECHECK_SECONDS
    (stall detection needs a clock, and it repairs anything a dropped watch missed) and deletes
    finished jobs when their TTL passes; controller/housekeeping.py says why it is one loop and
    not kopf timers. It goes through the same per-job lock as the event handlers, so it cannot
    race them into a second decision; with nothing changed it makes no API call.

    Started from the first job event rather than at startup: a task inherits the context it is
    created in, and only handler contexts carry kopf's event-posting queue (kopf.event).
    """
    # kopf hands each object a shallow copy of the operator's memo, so the task is kept on the
    # shared Reconciler: one loop for the whole operator, not one per job.
    reconciler = _reconciler(memo)
    if reconciler.housekeeping is not None:
        return
    housekeeper = Housekeeper(
        reconciler=_reconciler(memo),
        jobs=jobs_by_name,
        read_inputs=lambda key: _reader(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner)(),
        recheck_seconds=RECHECK_SECONDS,
        logger=logging.getLogger("colocgrpo.operator"),
    )
    reconciler.housekeeping = asyncio.get_running_loop().create_task(housekeeper.run(), name="colocgrpo-housekeeping")
