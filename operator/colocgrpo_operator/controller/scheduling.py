"""When reconciles run: one at a time per job, coalesced, deferred during a burst, retried.

Every trigger — the job's create/update/resume, an event of its batch Job or pods, the periodic
re-check — asks the `ReconcileScheduler` for a reconcile. It serializes them per job with an
asyncio lock, so two triggers never race each other into two decisions; it lets event-triggered
ones collapse while one waits for the lock; it runs the reconciles of child events in tasks of
their own; and it turns what a reconcile raises into what happens next: nothing (the job went
away), a retry of its own (a predecessor's children are still there; a transient API failure,
with backoff and one WARNING line, kube/transient.py), or the exception for the caller.
What a reconcile decides and does is controller/reconciler.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from colocgrpo_operator.controller.record import RecordExtras
from colocgrpo_operator.controller.snapshots import Inputs, Key
from colocgrpo_operator.kube.client import KubeApiError, ObjectGone, terminating_namespace
from colocgrpo_operator.kube.transient import describe, is_transient
from colocgrpo_operator.metrics import RECONCILE_ERRORS, RECONCILE_SECONDS

# How long a reconcile after a child event waits, at most, for the reconciles applying children.
DEFER_WHILE_APPLYING_SECONDS = 10.0
# How soon a job whose predecessor's children are still there looks again.
PREDECESSOR_RETRY_SECONDS = 2.0
# Backoff of a job's reconcile after transient API failures: the first retry after this long,
# each further one twice as late, at most TRANSIENT_RETRY_MAX_SECONDS (plus up to 25 % jitter).
TRANSIENT_RETRY_SECONDS = 1.0
TRANSIENT_RETRY_MAX_SECONDS = 30.0


class PredecessorPending(Exception):
    """A child of this job's name still belongs to a deleted predecessor (same name, other uid)
    that the garbage collector has not removed yet: applying ours must wait for it."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"{what} still belongs to a deleted job of the same name")


@dataclasses.dataclass(frozen=True)
class Request:
    """One reconcile asked for.

    Attributes:
        trigger: what asked (create, update, resume, child, workload, status, recheck, retry); a
            label of the reconcile metrics.
        ensure_children: apply every child, not only the batch Job when it is missing (create,
            spec change, resume, retry); such a reconcile never coalesces into another.
        fresh_cr: the job as the triggering event showed it, fresher than the index.
        record_extras: annotations that go with the job's first record, if this reconcile writes it.
    """

    trigger: str
    ensure_children: bool = False
    fresh_cr: dict[str, Any] | None = None
    record_extras: RecordExtras | None = None


# Decide and act for one job, its lock held: (key, the job's inputs, the request).
ReconcileLocked = Callable[[Key, Inputs, Request], Awaitable[None]]


class ReconcileScheduler:
    """Runs every reconcile of every job through `reconcile_locked` (the module docstring says how).

    Guarantees: reconciles of one job never overlap; a job's inputs are read only once its lock is
    held, so the reconcile that waited sees every change that arrived meanwhile.

    Args:
        reconcile_locked: decides and acts for one job; called with the job's lock held.
        logger: retries and failures of reconciles nobody awaits.
    """

    def __init__(self, reconcile_locked: ReconcileLocked, logger: logging.Logger):
        self.reconcile_locked = reconcile_locked
        self.logger = logger
        self._locks: dict[Key, asyncio.Lock] = {}
        self._queued: set[Key] = set()
        self._background: set[asyncio.Task[None]] = set()  # reconcile_soon's and retries' tasks
        # Jobs with a retry pending (whether it applies children), and their transient failures in a row.
        self._retries: dict[Key, bool] = {}
        self._failures: dict[Key, int] = {}
        self._wakeup = asyncio.Event()
        # Reconciles applying children (a job's create, spec change or resume) now; set when none.
        self._applying = 0
        self._applied = asyncio.Event()
        self._applied.set()

    async def reconcile(self, key: Key, read_inputs: Callable[[], Inputs], request: Request) -> None:
        """Reconcile one job now. Raises what the reconcile raises, but for a job that went away
        (kopf retries handler-triggered reconciles; the periodic re-check covers the rest).

        While one reconcile of a job waits for the lock, further ones that apply no children
        return at once: the waiting one will see their changes too.
        """
        if not request.ensure_children:
            if key in self._queued:
                return
            self._queued.add(key)
        await self._claimed(key, read_inputs, request)

    def reconcile_soon(self, key: Key, read_inputs: Callable[[], Inputs], request: Request) -> None:
        """A coalescible reconcile in a task of its own, for event handlers that need nothing
        from their event but the job's key (a Job or pod changed).

        The handler returns at once, so kopf drops the watch event it holds (a full object,
        managedFields and all) instead of keeping it while the job's lock is busy: in a burst,
        hundreds of child events waited like that at once, and that peak is what the operator's
        RSS keeps afterwards (docs/benchmarks/operator.md). Errors are logged; the periodic
        re-check retries, as it did for a failed event handler.

        While other reconciles apply children (a burst of new jobs), it waits for them first, for
        DEFER_WHILE_APPLYING_SECONDS at most, and the job's further events coalesce into it:
        status writes of jobs already started would otherwise compete with the creation of the
        last ones for the API threads and the apiserver.
        """
        if key in self._queued:
            return
        self._queued.add(key)
        self._in_background(self._reconcile_logged(key, read_inputs, request))

    async def _reconcile_logged(self, key: Key, read_inputs: Callable[[], Inputs], request: Request) -> None:
        try:
            if self._applying:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._applied.wait(), DEFER_WHILE_APPLYING_SECONDS)
            await self._claimed(key, read_inputs, request)
        except Exception as error:
            self.logger.warning("reconcile of %s/%s after a child event failed (will re-check): %s", *key, error)

    def _retry_later(self, key: Key, read_inputs: Callable[[], Inputs], delay: float, ensure_children: bool) -> None:
        """Reconcile `key` again after `delay` seconds (applying its children if this or any other
        retry asked for it since): one pending retry per job at most."""
        if key in self._retries:
            self._retries[key] = self._retries[key] or ensure_children
            return
        self._retries[key] = ensure_children

        async def retry() -> None:
            await asyncio.sleep(delay)
            children = self._retries.pop(key, ensure_children)
            try:
                await self.reconcile(key, read_inputs, Request("retry", ensure_children=children))
            except Exception as error:
                self.logger.warning("retried reconcile of %s/%s failed (will re-check): %s", *key, error)

        self._in_background(retry())

    def _backoff(self, key: Key) -> float:
        """Seconds until the next retry of a job after one more transient failure in a row."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(TRANSIENT_RETRY_SECONDS * 2 ** (failures - 1), TRANSIENT_RETRY_MAX_SECONDS)
        return delay * (1 + random.random() / 4)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)  # a reference, or the task could be garbage-collected mid-run
        task.add_done_callback(self._background.discard)

    @property
    def busy(self) -> bool:
        """Whether a reconcile started in the background (reconcile_soon, a retry) is still running."""
        return bool(self._background)

    async def cancel_background(self) -> None:
        """Stop the reconciles started in the background (at shutdown)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _claimed(self, key: Key, read_inputs: Callable[[], Inputs], request: Request) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._counted_as_applying(request.ensure_children), lock:
            if not request.ensure_children:
                self._queued.discard(key)
            cr, job, pods, workloads = read_inputs()
            if request.fresh_cr is not None:
                cr = request.fresh_cr
            started = time.perf_counter()
            try:
                await self.reconcile_locked(key, (cr, job, pods, workloads), request)
                self._failures.pop(key, None)
            except ObjectGone:
                # Deleted, or replaced by a new job of the same name, since the inputs were read:
                # nothing to do for this one (the new one has events of its own).
                self.logger.debug("%s/%s went away mid-reconcile", *key)
            except PredecessorPending as pending:
                self.logger.info("%s/%s: %s; trying again in %g s", key[0], key[1], pending, PREDECESSOR_RETRY_SECONDS)
                self._retry_later(key, read_inputs, PREDECESSOR_RETRY_SECONDS, ensure_children=True)
            except KubeApiError as error:
                if error.status == 404 or terminating_namespace(error):
                    # The job or its namespace is going away: expected, and nothing to act on.
                    self.logger.debug("%s/%s: not reconciled, it is being deleted: %s", key[0], key[1], error.message)
                    return
                RECONCILE_ERRORS.labels(trigger=request.trigger).inc()
                if not is_transient(error):
                    raise
                self._retry_transient(key, read_inputs, request, error)
            except Exception as error:
                RECONCILE_ERRORS.labels(trigger=request.trigger).inc()
                if not is_transient(error):
                    raise
                self._retry_transient(key, read_inputs, request, error)
            finally:
                RECONCILE_SECONDS.labels(trigger=request.trigger).observe(time.perf_counter() - started)

    def _retry_transient(
        self, key: Key, read_inputs: Callable[[], Inputs], request: Request, error: BaseException
    ) -> None:
        """A transient API failure (kube/transient.py): one WARNING line, and the same
        reconcile again after a backoff, instead of an exception for kopf to log and retry."""
        delay = self._backoff(key)
        self.logger.warning(
            "%s/%s: reconcile (%s) failed on a transient API error, retrying in %.1f s: %s",
            key[0],
            key[1],
            request.trigger,
            delay,
            describe(error),
        )
        self._retry_later(key, read_inputs, delay, request.ensure_children)

    @contextlib.asynccontextmanager
    async def _counted_as_applying(self, applying: bool) -> AsyncIterator[None]:
        """Count a reconcile that applies children (`applying`) while it waits and runs."""
        if not applying:
            yield
            return
        self._applying += 1
        self._applied.clear()
        try:
            yield
        finally:
            self._applying -= 1
            if not self._applying:
                self._applied.set()

    def forget(self, key: Key) -> None:
        """The job is gone: drop its lock and its failure count."""
        self._locks.pop(key, None)
        self._failures.pop(key, None)

    def wake_up(self) -> None:
        """Make the housekeeping loop look now (a job finished, or its TTL changed)."""
        self._wakeup.set()

    async def wait_for_wakeup(self, timeout: float) -> None:
        """Return after `wake_up` was called, or after `timeout` seconds (for the housekeeper)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        self._wakeup.clear()
