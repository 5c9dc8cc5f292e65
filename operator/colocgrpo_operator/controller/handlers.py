"""Thin kopf handlers: gather a job's inputs from the indices, let the Reconciler decide.

Children are watched, not polled: kopf keeps three in-memory indices fed by one watch
stream per kind (server-side filtered by the `colocgrpo.io/job-name` label):
ColocGRPOJobs by (namespace, name), their batch Jobs and their pods by the same key.
Any event of a Job or pod re-reconciles the job it belongs to; a periodic re-check of
active jobs covers stall detection and anything a dropped watch missed.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from typing import Any

import kopf

from colocgrpo_operator.api import GROUP, JOB_NAME_LABEL, PLURAL, VERSION
from colocgrpo_operator.controller import settings as _settings  # noqa: F401  (registers startup/cleanup)
from colocgrpo_operator.controller.reconciler import Key, Reconciler
from colocgrpo_operator.controller.snapshots import batch_job_snapshot, job_resource_snapshot, pod_snapshot
from colocgrpo_operator.controller.status import TERMINAL_PHASES, parse_time

RESOURCE = (GROUP, VERSION, PLURAL)
CHILD_LABELS = {JOB_NAME_LABEL: kopf.PRESENT}
# Re-check period of active jobs (stall detection granularity; a safety net for missed events).
RECHECK_SECONDS = float(os.environ.get(_settings.ENV_ACTIVE_INTERVAL, "10"))


# ----------------------------------------------------------------------------- indices


# Indexers are async (though they never await) because kopf runs sync callbacks in its thread
# pool: a thread hop per watch event would dominate the operator's CPU with hundreds of jobs.


@kopf.index(*RESOURCE)
async def jobs_by_name(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): job_resource_snapshot(body)}


@kopf.index("batch", "v1", "jobs", labels=CHILD_LABELS)
async def batch_jobs_by_owner(namespace: str, name: str, labels: kopf.Labels, body: kopf.Body,
                        **_: Any) -> dict[Key, dict[str, Any]] | None:
    # Only the Job named after its ColocGRPOJob is the gang.
    if labels.get(JOB_NAME_LABEL) != name:
        return None
    return {(namespace, name): batch_job_snapshot(body)}


@kopf.index("v1", "pods", labels=CHILD_LABELS)
async def pods_by_owner(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[JOB_NAME_LABEL]): pod_snapshot(body)}


def _first(index: kopf.Index, key: Key) -> Any:
    store = index.get(key)
    if not store:
        return None
    for value in store:
        return value
    return None


def _inputs(key: Key, jobs_by_name: kopf.Index, batch_jobs_by_owner: kopf.Index,
            pods_by_owner: kopf.Index) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A consistent snapshot (taken on the event loop, so the indices cannot change under it)."""
    pods = list(pods_by_owner.get(key) or [])
    return _first(jobs_by_name, key), _first(batch_jobs_by_owner, key), pods


def _reconciler(memo: kopf.Memo) -> Reconciler:
    return memo.reconciler


# ----------------------------------------------------------------------------- the job itself


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
async def reconcile_job(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, reason: str,
                        jobs_by_name: kopf.Index, batch_jobs_by_owner: kopf.Index, pods_by_owner: kopf.Index,
                        **_: Any) -> None:
    """Validate, apply every child (idempotently) and derive status. Safe to run any number
    of times: on create, on every spec change, and for every job when the operator starts."""
    key = (namespace, name)
    _, job, pods = _inputs(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner)
    cr = job_resource_snapshot(body)  # the freshest view: this very event's body
    await _reconciler(memo).reconcile(key, cr, job, pods, trigger=getattr(reason, "value", str(reason)), ensure_children=True)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("v1", "pods", labels=CHILD_LABELS)
async def child_changed(namespace: str, labels: kopf.Labels, memo: kopf.Memo, logger: logging.Logger,
                        jobs_by_name: kopf.Index, batch_jobs_by_owner: kopf.Index, pods_by_owner: kopf.Index,
                        **_: Any) -> None:
    """A Job or pod of some job changed (or vanished): re-derive that job's status."""
    key = (namespace, labels.get(JOB_NAME_LABEL, ""))
    cr, job, pods = _inputs(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner)
    if cr is None:
        return  # an orphan, or a job being deleted: garbage collection handles it
    try:
        await _reconciler(memo).reconcile(key, cr, job, pods, trigger="child")
    except Exception as error:  # event handlers are not retried; the re-check timer will be
        logger.warning("reconcile of %s/%s after a child event failed (will re-check): %s", *key, error)


@kopf.on.event(*RESOURCE)
async def job_event(type: str | None, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Forget a deleted job (caches, phase gauge); everything else is handled above."""
    if type == "DELETED":
        _reconciler(memo).forget((namespace, name))


def _is_active(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in TERMINAL_PHASES


@kopf.timer(*RESOURCE, interval=RECHECK_SECONDS, when=_is_active, idle=None)
async def recheck_active_job(namespace: str, name: str, memo: kopf.Memo, jobs_by_name: kopf.Index,
                             batch_jobs_by_owner: kopf.Index, pods_by_owner: kopf.Index, **_: Any) -> None:
    """Periodic re-derivation of an active job: stall detection needs a clock, not an event.

    It reads the same indices as the event handlers and goes through the same per-job lock,
    so it cannot race the create handler into a second decision; with nothing changed it
    makes no API call at all.
    """
    key = (namespace, name)
    cr, job, pods = _inputs(key, jobs_by_name, batch_jobs_by_owner, pods_by_owner)
    await _reconciler(memo).reconcile(key, cr, job, pods, trigger="timer")


# ----------------------------------------------------------------------------- TTL


def _ttl_deadline(spec: kopf.Spec, status: kopf.Status) -> datetime | None:
    ttl = (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    finished = parse_time(status.get("completionTime"))
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0 or finished is None:
        return None
    from datetime import timedelta

    return finished + timedelta(seconds=ttl)


def _finished_with_ttl(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") in TERMINAL_PHASES and _ttl_deadline(spec, status) is not None


def _seconds_until_ttl(spec: kopf.Spec, status: kopf.Status, **_: Any) -> float:
    # Derived from status.completionTime, so a restarted operator fires on the original time.
    deadline = _ttl_deadline(spec, status)
    if deadline is None:
        return 0.0
    return max((deadline - datetime.now(timezone.utc)).total_seconds(), 0.0)


@kopf.timer(*RESOURCE, interval=5, when=_finished_with_ttl, initial_delay=_seconds_until_ttl)
async def expire_finished_job(namespace: str, name: str, uid: str, spec: kopf.Spec, status: kopf.Status,
                              memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Delete a finished job ttlSecondsAfterFinished after its completionTime (children follow
    by garbage collection). The first tick is scheduled for the deadline itself; later ticks
    only matter when the TTL was raised after the job finished."""
    deadline = _ttl_deadline(spec, status)
    if deadline is None or datetime.now(timezone.utc) < deadline:
        return
    reconciler = _reconciler(memo)
    deleted = await reconciler._blocking(reconciler.kube.delete_job_resource, namespace, name, uid)
    if deleted:
        logger.info("deleted %s/%s: ttlSecondsAfterFinished passed", namespace, name)
