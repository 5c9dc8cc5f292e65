"""The operator-wide clock: re-check active jobs, delete finished ones when their TTL passes.

One loop for all jobs rather than kopf timers per job, on purpose:
- a kopf timer (or daemon) makes kopf put a finalizer on its job; a finalizer blocks the job's
  deletion whenever the operator is not running, and kopf does not start serving a namespace
  that is already terminating, so a namespace deleted while the operator was away would hang
  forever. This operator adds no finalizer at all: children go by garbage collection.
- one task instead of one per job keeps 500 jobs cheap (memory, wake-ups).

Both duties derive everything from the indices and the operator's record of each job (record.py:
whether it finished, and when), never from its status, which the trainer may write; so a
restarted operator fires on the original deadlines, and a forged phase or completionTime neither
stops a job's re-checks nor deletes it early. The TTL also waits for the batch Job to have
finished for real. The loop sleeps until the next TTL deadline
or the next re-check, whichever is sooner, and is woken early when a job finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from colocgrpo_operator.controller.objects import job_condition, owned_by, parse_time
from colocgrpo_operator.controller.reconciler import Reconciler
from colocgrpo_operator.controller.record import Record
from colocgrpo_operator.controller.snapshots import Inputs, Key, newest_view


def ttl_deadline(cr: dict[str, Any] | None, record: Record | None, batch_job: dict[str, Any] | None) -> datetime | None:
    """The record's completionTime + runPolicy.ttlSecondsAfterFinished (the job's own, else its
    runtime snapshot's) of a job the operator recorded as finished, once its batch Job (if it
    still has one) has finished too; else None."""
    if not cr or record is None or record.outcome is None:
        return None
    ttl = ((cr.get("spec") or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    if ttl is None and record.runtime is not None:  # the runtime's, as the job's last gang was merged with it
        ttl = ((record.runtime.spec.get("template") or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    finished = parse_time(record.completion_time)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0 or finished is None:
        return None
    uid = (cr.get("metadata") or {}).get("uid")
    if batch_job is not None and owned_by(batch_job, uid) and not _job_finished(batch_job):
        return None  # its pods may still be running: deleting the job would take them down
    return finished + timedelta(seconds=ttl)


def _job_finished(batch_job: dict[str, Any]) -> bool:
    return bool(job_condition(batch_job, "Complete") or job_condition(batch_job, "Failed"))


class Housekeeper:
    """The operator-wide clock (the module docstring says why one loop).

    Args:
        reconciler: every re-check goes through its `reconcile` (and so through the job's lock);
            its wake-ups shorten the loop's sleep.
        jobs: the live index of ColocGRPOJobs (key -> packed views), read each round.
        read_inputs: one job's inputs from the indices, called once the job's lock is held.
        recheck_seconds: period of the re-check of every active job.
        logger: where failed re-checks and TTL deletions are reported (they never stop the loop).
    """

    def __init__(
        self,
        reconciler: Reconciler,
        jobs: Mapping[Key, Iterable[str]],
        read_inputs: Callable[[Key], Inputs],
        recheck_seconds: float,
        logger: logging.Logger,
    ):
        self.reconciler = reconciler
        self.jobs = jobs
        self.read_inputs = read_inputs
        self.recheck_seconds = recheck_seconds
        self.logger = logger
        self._expired: set[tuple[Key, str]] = set()

    async def run(self) -> None:
        """Re-check and expire until cancelled; an error of one job never ends the loop."""
        loop = asyncio.get_running_loop()
        # The first re-check waits one period, so kopf has listed every Job and pod by then.
        last_recheck = loop.time()
        next_ttl: float | None = None
        while True:
            until_recheck = self.recheck_seconds - (loop.time() - last_recheck)
            timeout = until_recheck if next_ttl is None else min(until_recheck, next_ttl)
            # At most two rounds a second however often jobs finish (TTL precision: 0.5 s).
            await self.reconciler.schedule.wait_for_wakeup(max(timeout, 0.5))
            if loop.time() - last_recheck >= self.recheck_seconds:
                await self._recheck_active()
                last_recheck = loop.time()
                release_free_memory()
            next_ttl = await self._expire_finished()

    async def _recheck_active(self) -> None:
        for key in list(self.jobs.keys()):
            cr = newest_view(self.jobs, key)
            record = self.reconciler.ledger.record(key, cr)
            if cr is None or (record is not None and record.finished):
                continue
            try:
                await self.reconciler.reconcile(key, functools.partial(self.read_inputs, key), trigger="recheck")
            except asyncio.CancelledError:
                raise
            except Exception as error:  # one job's API error must not stop the others' clock
                self.logger.warning("re-check of %s/%s failed: %s", *key, error)

    async def _expire_finished(self) -> float | None:
        """Delete every job past its TTL; return seconds until the next deadline (or None)."""
        now = datetime.now(UTC)
        soonest: float | None = None
        for key in list(self.jobs.keys()):
            cr = newest_view(self.jobs, key)
            record = self.reconciler.ledger.record(key, cr)
            if cr is None or record is None or not record.finished:
                continue
            _, batch_job, _, _ = self.read_inputs(key)  # only for finished jobs: their gang's Job
            deadline = ttl_deadline(cr, record, batch_job)
            if deadline is None:
                continue
            uid = (cr.get("metadata") or {}).get("uid") or ""
            if deadline > now:
                left = (deadline - now).total_seconds()
                soonest = left if soonest is None else min(soonest, left)
                continue
            if (key, uid) in self._expired or (cr.get("metadata") or {}).get("deletionTimestamp"):
                continue
            self._expired.add((key, uid))
            try:
                deleted = await self.reconciler.delete_job(key, uid)
            except Exception as error:
                self._expired.discard((key, uid))  # try again on the next round
                self.logger.warning("deleting %s/%s after its TTL failed: %s", *key, error)
                continue
            if deleted:
                self.logger.info("deleted %s/%s: ttlSecondsAfterFinished passed", *key)
        return soonest


def release_free_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise, so a burst of watch events
    would pin the operator's RSS at its peak forever). No-op outside glibc."""
    with contextlib.suppress(AttributeError):
        _LIBC.malloc_trim(0)


try:
    import ctypes

    _LIBC: Any = ctypes.CDLL("libc.so.6")
except OSError:
    _LIBC = None
