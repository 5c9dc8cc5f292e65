"""One reconcile of one ColocGRPOJob: decide (pure, controller/status.py), then act.

Every trigger — the job's create/update/resume, an event of its batch Job or pods, the
periodic re-check — ends up here, serialized per job by an asyncio lock, so two triggers
never race each other into two decisions. Decisions are level-based (derived from what
exists now), which is what makes an operator killed at any point safe to restart:

- children have deterministic names, so re-creating one is a 409 (no duplicate Job);
- a gang restart is recorded (restarts, lastFailure.jobUid) *before* the failed Job is
  deleted, and a failure of a Job uid already recorded is never counted twice;
- the operator's record on the job's metadata (record.py) is the only memory, apart from
  caches that can be rebuilt. The status shows it, but is never read back as the truth: the
  trainer may write the status subresource.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from colocgrpo_operator.api import KIND, JobSpecError, parse_job
from colocgrpo_operator.api.naming import RECORD_ANNOTATION
from colocgrpo_operator.controller import status as derive
from colocgrpo_operator.controller.conditions import condition_of, set_condition
from colocgrpo_operator.controller.kube import KubeApi, KubeApiError, ObjectGone, terminating_namespace
from colocgrpo_operator.controller.metrics import GANG_RESTARTS, RECONCILE_ERRORS, RECONCILE_SECONDS, PhaseBook
from colocgrpo_operator.controller.record import Record, record_of
from colocgrpo_operator.controller.snapshots import batch_job_snapshot, pack, unpack
from colocgrpo_operator.controller.workers import creation_refusal

Key = tuple[str, str]  # (namespace, name)
# (the ColocGRPOJob, its batch Job, the Job's pods, the Kueue Workloads of Jobs of its name) as the
# indices hold them now
Inputs = tuple[dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]

# Phases worth a Warning event; the rest are Normal.
_WARNING_PHASES = frozenset({derive.RESTARTING, derive.FAILED})
# Reasons of the Running condition worth a Warning event of their own, though the phase stays.
_WARNING_REASONS = frozenset({derive.POD_CREATION_FAILED})


def _running_reason(status: Mapping[str, Any]) -> Any:
    return (condition_of(dict(status), "Running") or {}).get("reason")


# The largest spec the operator accepts. kopf keeps the last handled spec in an annotation, and a
# job's annotations together may hold 256 KiB: a larger spec could not be tracked (its changes
# would be taken for a new job's, unguarded by the frozen-spec check).
MAX_SPEC_BYTES = 128 * 1024


def spec_size(cr: dict[str, Any]) -> int:
    """Bytes of the spec as compact JSON (what kopf's annotation would hold)."""
    return len(json.dumps(cr.get("spec"), separators=(",", ":"), ensure_ascii=False).encode())


class ParsedSpec:
    """A spec parsed once per generation: what every reconcile needs (validity, run facts, the
    plan warning), or the problems that refuse it.

    The typed job (a pydantic model, ~10 KiB a job) is only needed to render children, which
    happens on create, spec changes and gang restarts, not on the many child events and
    re-checks in between; so it is not kept once the facts are taken from it, and is parsed
    again when children are rendered (`job_model`, ~0.1 ms), rather than kept for every job the
    operator knows, or for every new job of a burst while it waits for the API threads.
    """

    def __init__(self, cr: dict[str, Any]):
        self.valid = False
        self.problems: list[tuple[str, str]] = []
        self.facts: derive.RunFacts | None = None
        self.plan_warning: tuple[bool, str, str] | None = None
        meta = cr.get("metadata") or {}
        size = spec_size(cr)
        if size > MAX_SPEC_BYTES:
            self.problems = [
                (
                    "spec",
                    f"is {size} bytes of JSON, more than the {MAX_SPEC_BYTES} the operator can track (it keeps a "
                    "copy in an annotation, and all annotations share 256 KiB); shorten spec.trainerArgs or other "
                    "long values",
                )
            ]
            return
        try:
            job = _parse_user_spec(cr)
        except JobSpecError as error:
            self.problems = list(error.errors) or [("spec", str(error))]
            return
        except Exception as error:  # a validator bug must not take the operator down
            self.problems = [("spec", f"could not be validated: {error}")]
            return
        spec = job.spec
        self.facts = derive.RunFacts(
            nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node,
            max_restarts=spec.run_policy.max_restarts,
            suspend=spec.run_policy.suspend,
            queue_name=spec.scheduling.queue_name,
            stall_timeout_seconds=spec.run_policy.stall_timeout_seconds,
            active_deadline_seconds=spec.run_policy.active_deadline_seconds,
            generation=meta.get("generation"),
        )
        self.plan_warning = _plan_warning(cr) if spec.resources.gpus_per_node > 0 else None
        self.valid = True

    def job_model(self, cr: dict[str, Any]) -> Any:
        """The typed job (only for a valid spec), parsed again: the caller holds it as long as it
        needs it."""
        return _parse_user_spec(cr)


def _parse_user_spec(cr: dict[str, Any]) -> Any:
    # Status is the operator's own output; only what the user wrote is validated.
    return parse_job({k: v for k, v in cr.items() if k != "status"})


def _plan_warning(cr: dict[str, Any]) -> tuple[bool, str, str] | None:
    """(warn, reason, message) from the memory planner, or None if it is unavailable.

    The planner lives in colocgrpo_training (light, torch-free); it is optional for the
    operator, and a planner error never blocks a job (it only loses its warning).
    """
    try:
        from colocgrpo_training.planner import plan_job
    except ImportError:
        return None
    try:
        plan = plan_job(cr)
    except Exception as error:  # PlanInputError or a planner bug: say so, do not fail
        return True, "PlanUnavailable", f"the memory plan could not be computed: {error}"
    if not plan.fits:
        return True, "DoesNotFit", plan.condition_message()
    if plan.warnings:
        return True, "MemoryWarning", plan.condition_message()
    return False, "Fits", plan.condition_message() or "the memory plan fits"


def _now() -> datetime:
    return datetime.now(UTC)


def _status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning `current` into `desired`: removed keys become null; never progress."""
    patch = {k: v for k, v in desired.items() if k != "progress"}
    for key in current:
        if key != "progress" and key not in desired:
            patch[key] = None
    return patch


def status_without_progress(cr: Mapping[str, Any] | None) -> dict[str, Any]:
    status = (cr or {}).get("status")
    return {k: v for k, v in status.items() if k != "progress"} if isinstance(status, Mapping) else {}


@dataclasses.dataclass(frozen=True)
class _Known:
    """What the operator last wrote for one incarnation (`uid`) of a job: its last two statuses
    (packed, newest last), its record (encoded; None while the job has none), and the
    resourceVersions of the objects its last writes produced, with the status the newest of them
    holds (packed). The watch, and so the index, may lag behind these writes. resourceVersions
    are only compared for equality (the API calls them opaque): a version one of these writes
    produced is never someone else's write, and one older than the newest lags behind it.
    Otherwise the contents are compared: the index has caught up once it shows the newest status
    and the record; showing an older status of ours, it lags; showing any other status, someone
    else wrote it (the trainer's token may patch the status), and the index is what is there.

    The versions matter in a burst: the event of the record's own patch (written before the first
    batch Job, with no status yet) often reaches the operator only after the first status write,
    and must not pass for someone else emptying the status."""

    uid: str
    statuses: tuple[str, ...]
    record: str | None
    phase: str | None  # the phase last written (and announced by an Event)
    versions: tuple[str, ...] = ()  # newest last
    versioned_status: str | None = None  # the status (packed) of the object at versions[-1]


@dataclasses.dataclass
class _Current:
    """What one reconcile takes to be in place, updated by its own writes: the job's status
    (without progress) and its record (None when it has none yet)."""

    status: dict[str, Any]
    record: Record | None

    def record_or_empty(self) -> Record:
        return self.record if self.record is not None else Record()


@dataclasses.dataclass
class RecordExtras:
    """Annotations a job's first record carries in the same patch (a new job's kopf diff-base,
    handlers.reconcile_job says why); `written` once that patch succeeded."""

    annotations: Mapping[str, Any]
    written: bool = False


class PredecessorPending(Exception):
    """A child of this job's name still belongs to a deleted predecessor (same name, other uid)
    that the garbage collector has not removed yet: applying ours must wait for it."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"{what} still belongs to a deleted job of the same name")


# The API server's answer when an apply would give a child a second controller owner.
_SECOND_CONTROLLER = "Only one reference can have Controller set to true"
# How many of the operator's last writes of a job are recognised by their resourceVersion (a
# reconcile writes at most the record and the status; the one before may still be in flight).
_KEPT_VERSIONS = 4
# How long a reconcile after a child event waits, at most, for the reconciles applying children.
DEFER_WHILE_APPLYING_SECONDS = 10.0
# How soon a job whose predecessor's children are still there looks again.
PREDECESSOR_RETRY_SECONDS = 2.0


class Reconciler:
    """Every reconcile of every job goes through one instance (`OperatorRuntime.reconciler`).

    Guarantees: reconciles of one job never overlap (a per-job asyncio lock); blocking API calls
    run in `executor`, never on the event loop; the status is only written when it changed, and
    never its `progress` (the trainer's).

    Args:
        kube: the blocking API client.
        default_image: trainer image for jobs whose spec names none (None: the renderer's default).
        executor: where blocking API calls run (kopf's executor, `--api-threads` threads).
        logger: phase transitions, gang restarts and background failures.
    """

    def __init__(
        self, kube: KubeApi, default_image: str | None, executor: concurrent.futures.Executor, logger: logging.Logger
    ):
        self.kube = kube
        self.default_image = default_image
        self.executor = executor
        self.logger = logger
        self.phases = PhaseBook()
        self._locks: dict[Key, asyncio.Lock] = {}
        self._queued: set[Key] = set()
        self._background: set[asyncio.Task[None]] = set()  # reconcile_soon's tasks
        self._wakeup = asyncio.Event()
        self._specs: dict[tuple[str, Any], ParsedSpec] = {}
        # The operator's own last writes per job (_Known says how they are used): deciding from
        # an index that lags behind them could count a failure twice.
        self._known: dict[Key, _Known] = {}
        self._events_refused = False  # warned once that Events cannot be listed
        # Reconciles applying children (a job's create, spec change or resume) now; set when none.
        self._applying = 0
        self._applied = asyncio.Event()
        self._applied.set()

    # -- helpers --------------------------------------------------------------------------------

    async def _blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def parsed(self, cr: dict[str, Any]) -> ParsedSpec:
        """The job's spec parsed once per (uid, generation), cached."""
        meta = cr.get("metadata") or {}
        cache_key = (meta.get("uid") or "", meta.get("generation"))
        parsed = self._specs.get(cache_key)
        if parsed is None:
            if len(self._specs) > 4096:
                self._specs.clear()
            parsed = self._specs[cache_key] = ParsedSpec(cr)
        return parsed

    def wake_up(self) -> None:
        """Make the housekeeping loop look now (a job finished, or its TTL changed)."""
        self._wakeup.set()

    async def wait_for_wakeup(self, timeout: float) -> None:
        """Return after `wake_up` was called, or after `timeout` seconds (for the housekeeper)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        self._wakeup.clear()

    async def delete_job(self, key: Key, uid: str | None) -> bool:
        """Delete the ColocGRPOJob itself (only that exact object when `uid` is given; its
        children go by garbage collection), in an executor thread. Returns False when it is
        already gone or has been replaced by another of the same name; raises KubeApiError
        on any other refusal."""
        return await self._blocking(self.kube.delete, KIND, key[0], key[1], uid=uid)

    def record(self, key: Key, cr: Mapping[str, Any] | None) -> Record | None:
        """The operator's record of the job: its own last write while the index has not caught up
        with it, else the one on `cr` (None when the job has none)."""
        known = self._known.get(key)
        uid = ((cr or {}).get("metadata") or {}).get("uid")
        if known is not None and known.uid == uid and known.record is not None:
            return Record.decode(known.record)
        return record_of(dict(cr) if cr is not None else None)

    def status_drifted(self, key: Key, cr: Mapping[str, Any] | None) -> bool:
        """Whether `cr` carries a status, progress aside, that is none of the operator's own last
        writes: someone else wrote it, so it is derived again (and rewritten) at once."""
        known = self._known.get(key)
        uid = ((cr or {}).get("metadata") or {}).get("uid")
        if known is None or cr is None or known.uid != uid or not known.statuses:
            return False
        if _version_of(cr) in known.versions:
            return False  # an object one of the operator's own writes produced
        status = status_without_progress(cr)
        return all(unpack(packed) != status for packed in known.statuses)

    def forget(self, key: Key) -> None:
        """The job is gone: drop its caches and its phase from the gauge."""
        self._locks.pop(key, None)
        self._known.pop(key, None)
        self.phases.set(key, None)

    # -- the reconcile ----------------------------------------------------------------------------

    async def reconcile(
        self,
        key: Key,
        read_inputs: Callable[[], Inputs],
        *,
        trigger: str,
        ensure_children: bool = False,
        fresh_cr: dict[str, Any] | None = None,
        record_extras: RecordExtras | None = None,
    ) -> None:
        """Bring one job's children and status in line with the world. Raises on API errors
        (kopf retries handler-triggered reconciles; the periodic re-check covers the rest).
        `record_extras` go with the job's first record, if this reconcile writes it.

        Inputs are read only once the job's lock is held, so a burst of pod and Job events
        collapses: while one reconcile of a job waits for the lock, further event-triggered
        ones return at once — the waiting one will see their changes too.
        """
        coalescible = not ensure_children
        if coalescible:
            if key in self._queued:
                return
            self._queued.add(key)
        await self._reconcile_claimed(key, read_inputs, trigger, ensure_children, fresh_cr, record_extras)

    def reconcile_soon(self, key: Key, read_inputs: Callable[[], Inputs], *, trigger: str) -> None:
        """A coalescible reconcile in a task of its own, for event handlers that need nothing
        from their event but the job's key (a Job or pod changed).

        The handler returns at once, so kopf drops the watch event it holds (a full object,
        managedFields and all) instead of keeping it while the job's lock is busy: in a
        500-job burst, hundreds of child events waited like that at once, and that peak is
        what the operator's RSS keeps afterwards (docs/benchmarks/operator.md). Errors are
        logged; the periodic re-check retries, as it did for a failed event handler.

        While other reconciles apply children (a burst of new jobs), it waits for them first, for
        DEFER_WHILE_APPLYING_SECONDS at most, and the job's further events coalesce into it: in a
        500-job burst each job's status was written 2.1–2.7 times while the last Jobs were still
        to be created, competing with their creation for the API threads and the apiserver.
        """
        if key in self._queued:
            return
        self._queued.add(key)
        task = asyncio.get_running_loop().create_task(self._reconcile_logged(key, read_inputs, trigger))
        self._background.add(task)  # a reference, or the task could be garbage-collected mid-run
        task.add_done_callback(self._background.discard)

    async def _reconcile_logged(self, key: Key, read_inputs: Callable[[], Inputs], trigger: str) -> None:
        try:
            if self._applying:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._applied.wait(), DEFER_WHILE_APPLYING_SECONDS)
            await self._reconcile_claimed(key, read_inputs, trigger, False, None)
        except Exception as error:
            self.logger.warning("reconcile of %s/%s after a child event failed (will re-check): %s", *key, error)

    async def cancel_background(self) -> None:
        """Stop the reconciles started by reconcile_soon (at shutdown)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reconcile_claimed(
        self,
        key: Key,
        read_inputs: Callable[[], Inputs],
        trigger: str,
        ensure_children: bool,
        fresh_cr: dict[str, Any] | None,
        record_extras: RecordExtras | None = None,
    ) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._counted_as_applying(ensure_children), lock:
            if not ensure_children:
                self._queued.discard(key)
            cr, job, pods, workloads = read_inputs()
            if fresh_cr is not None:
                cr = fresh_cr
            started = time.perf_counter()
            try:
                await self._reconcile_locked(
                    key, cr, job, pods, workloads, ensure_children=ensure_children, record_extras=record_extras
                )
            except ObjectGone:
                # Deleted, or replaced by a new job of the same name, since the inputs were read:
                # nothing to do for this one (the new one has events of its own).
                self.logger.debug("%s/%s went away mid-reconcile", *key)
            except PredecessorPending as pending:
                self.logger.info("%s/%s: %s; trying again in %g s", key[0], key[1], pending, PREDECESSOR_RETRY_SECONDS)
                self._retry_later(key, read_inputs)
            except KubeApiError as error:
                if error.status == 404 or terminating_namespace(error):
                    # The job or its namespace is going away: expected, not an error.
                    self.logger.info("%s/%s: not reconciled, it is being deleted: %s", key[0], key[1], error.message)
                    return
                RECONCILE_ERRORS.labels(trigger=trigger).inc()
                raise
            except Exception:
                RECONCILE_ERRORS.labels(trigger=trigger).inc()
                raise
            finally:
                RECONCILE_SECONDS.labels(trigger=trigger).observe(time.perf_counter() - started)

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

    def _retry_later(self, key: Key, read_inputs: Callable[[], Inputs]) -> None:
        """Reconcile `key` again, children included, after PREDECESSOR_RETRY_SECONDS."""

        async def retry() -> None:
            await asyncio.sleep(PREDECESSOR_RETRY_SECONDS)
            try:
                await self.reconcile(key, read_inputs, trigger="retry", ensure_children=True)
            except Exception as error:
                self.logger.warning("retried reconcile of %s/%s failed (will re-check): %s", *key, error)

        task = asyncio.get_running_loop().create_task(retry())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reconcile_locked(
        self,
        key: Key,
        cr: dict[str, Any] | None,
        job: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        workloads: list[dict[str, Any]],
        *,
        ensure_children: bool,
        record_extras: RecordExtras | None = None,
    ) -> None:
        if cr is None:
            self.forget(key)
            return
        meta = cr.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # garbage collection removes the children; nothing to decide
        now = _now()
        progress = (cr.get("status") or {}).get("progress")
        current = self._current(key, cr)

        parsed = self.parsed(cr)
        if parsed.facts is None:
            desired = derive.invalid_spec_status(
                current.record_or_empty(), current.status, parsed.problems, now, meta.get("generation")
            )
            await self._write_status(key, cr, current, desired)
            return
        await self._reconcile_valid(
            key,
            cr,
            job,
            pods,
            workloads,
            parsed,
            parsed.facts,
            current,
            progress,
            now,
            ensure_children=ensure_children,
            record_extras=record_extras,
        )

    def _current(self, key: Key, cr: dict[str, Any]) -> _Current:
        """The job's status and record as this reconcile starts from them (_Known says why the
        operator's own last writes may stand in for what the index shows)."""
        meta = cr.get("metadata") or {}
        indexed = status_without_progress(cr)
        record = record_of(cr)
        known = self._known.get(key)
        if known is None:
            return _Current(indexed, record)
        if known.uid != meta.get("uid"):
            self._known.pop(key, None)  # a previous incarnation's: never carried over
            return _Current(indexed, record)
        version = _version_of(cr)
        if version is not None and version in known.versions[:-1] and known.versioned_status is not None:
            indexed = unpack(known.versioned_status)  # the index shows an older object of our writes
        elif known.statuses:
            newest = unpack(known.statuses[-1])
            if indexed != newest and any(unpack(packed) == indexed for packed in known.statuses[:-1]):
                indexed = newest  # the index still shows an older write of ours
        if known.record is not None and (record is None or record.encode() != known.record):
            record = Record.decode(known.record)  # the index has not caught up with the record
        return _Current(indexed, record)

    async def _reconcile_valid(
        self,
        key: Key,
        cr: dict[str, Any],
        job: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        workloads: list[dict[str, Any]],
        parsed: ParsedSpec,
        facts: derive.RunFacts,
        current: _Current,
        progress: Any,
        now: datetime,
        *,
        ensure_children: bool,
        record_extras: RecordExtras | None = None,
    ) -> None:
        meta = cr.get("metadata") or {}
        previous = current.status
        # Every job gets its record before its first batch Job, so no trainer runs without one
        # (record.py); a job an earlier operator started has its record in the status. A job
        # without one yet has it written together with its other children (one round trip less
        # before the Job), and in any case before the Job is created or anything else is done.
        first_record = None
        if current.record is None:
            first_record = Record.from_status(previous) if previous.get("phase") else Record()

        def record_now() -> Record:
            return current.record if current.record is not None else (first_record or Record())

        async def write_first_record() -> None:
            if current.record is None and first_record is not None:
                await self._write_record(key, cr, current, first_record, record_extras)

        # A Job of the same name that this job does not own (a predecessor with the same name
        # still being garbage-collected) is not ours to judge; creating ours waits for it.
        if job is not None and not owned_by(job, meta.get("uid")):
            job = None
        # Only pods of this incarnation's Job are its evidence: a predecessor's pod failing in
        # flight must not count as this job's failure.
        job_uid = (job.get("metadata") or {}).get("uid") if job is not None else None
        pods = [p for p in pods if job_uid is not None and owned_by(p, job_uid)]

        def decide(
            batch_job: dict[str, Any] | None, refusal: str | None = None
        ) -> tuple[derive.Assessment, dict[str, Any]]:
            assessment = derive.assess(
                facts, batch_job, pods, record_now(), previous, now, progress, workloads, refusal
            )
            desired = assessment.status
            if parsed.plan_warning is not None:
                warn, reason, message = parsed.plan_warning
                desired = dict(
                    desired,
                    conditions=set_condition(
                        desired.get("conditions", []), "PlanWarning", warn, reason, message, now, meta.get("generation")
                    ),
                )
            return assessment, desired

        assessment, desired = decide(job)
        if assessment.check_pod_creation and job_uid is not None:
            # The Job lacks pods past the grace period: ask the Job controller's Events why.
            refusal = await self._creation_refusal(key, job_uid)
            if refusal is not None:
                assessment, desired = decide(job, refusal)
        action = assessment.action
        # Pods killed by a namespace teardown are not a gang failure: no restart, no count, and no
        # phase change written or announced into a namespace that refuses new Events. Asked only
        # when a failure or pods going away would change something (one GET, rarely).
        going = any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods)
        if (assessment.failure is not None or (going and desired.get("phase") != previous.get("phase"))) and (
            await self._blocking(self.kube.namespace_terminating, key[0])
        ):
            self.logger.info("%s/%s: its namespace is being deleted; nothing to judge", *key)
            return
        try:
            # A Job about to be (re)created gets every other child first: a job revived after its
            # children were refused or went missing would otherwise run without them.
            apply = (ensure_children or action is derive.Action.CREATE_JOB) and (
                desired.get("phase") not in derive.TERMINAL_PHASES
            )
            if apply or action is derive.Action.CREATE_JOB:
                # One render for the children and the Job (it builds the typed job's every object).
                rendered = await self._blocking(self._render, parsed, cr)
                if apply:
                    await self._apply_children(rendered, not previous, write_first_record())
                await write_first_record()
                if action is derive.Action.CREATE_JOB:
                    job_object = next(c for c in rendered if c.get("kind") == "Job")
                    created = await self._blocking(self._create_job, job_object, facts, assessment.record, now)
                    if created is not None:
                        self.logger.info("created the gang's batch Job %s/%s", *key)
                        # Judge from the Job just created, not from "no Job yet": saves writing a
                        # Pending status that the Job's first watch event would overwrite at once.
                        assessment, desired = decide(batch_job_snapshot(created))
            await write_first_record()
        except KubeApiError as error:
            if error.status not in (400, 422):
                raise
            # The API server refused a child rendered from this spec (e.g. a malformed toleration
            # or env entry in a free-form field): the spec is the problem and retrying cannot
            # help, so say so the way an invalid spec is reported.
            problems = [("spec", f"the API server refused a child object: {error.message}")]
            await write_first_record()
            desired = derive.invalid_spec_status(
                current.record_or_empty(), previous, problems, now, meta.get("generation")
            )
            await self._write_status(key, cr, current, desired)
            return
        # Record before acting: a restart is counted before the failed Job is deleted.
        await self._write_record(key, cr, current, assessment.record)
        await self._write_status(key, cr, current, desired)
        if assessment.record.finished:
            # Its TTL may wait for the batch Job to finish: a change of that Job is a reason to look.
            self.wake_up()
        if action is derive.Action.CREATE_JOB:
            return
        if action is derive.Action.RESTART_GANG and job is not None:
            uid = (job.get("metadata") or {}).get("uid")
            deleted = await self._blocking(self.kube.delete, "Job", key[0], key[1], propagation="Foreground", uid=uid)
            if deleted and assessment.failure is not None:
                GANG_RESTARTS.labels(counted=str(assessment.failure.counted).lower()).inc()
                self.logger.warning("gang restart after %s: %s", assessment.failure.reason, assessment.failure.message)
        elif action is derive.Action.STOP_JOB and job is not None:
            uid = (job.get("metadata") or {}).get("uid")
            if await self._blocking(self.kube.delete, "Job", key[0], key[1], propagation="Foreground", uid=uid):
                self.logger.info("deleted the Kueue-managed Job of suspended %s/%s", *key)
        elif action in (derive.Action.SUSPEND_JOB, derive.Action.RESUME_JOB):
            await self._blocking(self.kube.patch_job_suspend, key[0], key[1], action is derive.Action.SUSPEND_JOB)

    async def _creation_refusal(self, key: Key, job_uid: str) -> str | None:
        """Why the Job controller cannot create the Job's pods (its newest FailedCreate Event), or
        None. A lookup forbidden by RBAC (a role without `list events`) costs the job its
        explanation only; any other API error fails the reconcile, to be retried like any other."""
        try:
            events = await self._blocking(self.kube.failed_create_events, key[0], job_uid)
        except KubeApiError as error:
            if error.status != 403:
                raise
            if not self._events_refused:
                self._events_refused = True
                self.logger.warning("cannot list the Job controller's Events (pod creation failures): %s", error)
            return None
        return creation_refusal(events, job_uid)

    async def _write_record(
        self, key: Key, cr: dict[str, Any], current: _Current, record: Record, extras: RecordExtras | None = None
    ) -> None:
        """Patch the job's record annotation when it changed (a metadata patch of this very
        incarnation: the trainer, which may write the status, cannot write this), with `extras`'
        annotations in the same patch."""
        if current.record == record:
            return
        uid = (cr.get("metadata") or {}).get("uid") or ""
        annotations = {**(extras.annotations if extras is not None else {}), RECORD_ANNOTATION: record.encode()}
        written = await self._blocking(self.kube.patch_annotations, key[0], key[1], uid, annotations)
        if extras is not None:
            extras.written = True
        current.record = record
        self._remember(key, uid, current, status=None, written=written)

    def _remember(
        self, key: Key, uid: str, current: _Current, status: dict[str, Any] | None, written: Mapping[str, Any] | None
    ) -> None:
        """Keep what was just written (`status`, when a status write) with the record in place, and
        the version of the object the write produced (`written`, the API server's answer)."""
        known = self._known.get(key)
        ours = known is not None and known.uid == uid
        # Only statuses this operator wrote: one someone else wrote must never pass for its own.
        statuses = known.statuses if known is not None and ours else ()
        if status is not None:
            statuses = (*statuses[-1:], pack(status))
        phase = status.get("phase") if status is not None else (known.phase if known is not None else None)
        record = None if current.record is None else current.record.encode()
        versions = known.versions if known is not None and ours else ()
        versioned_status = known.versioned_status if known is not None and ours else None
        version = _version_of(written)
        if version is not None and isinstance(written, Mapping):
            versions = (*versions[-(_KEPT_VERSIONS - 1) :], version)
            versioned = pack(status_without_progress(written))
            # The same string as the newest status where they agree (the common case): no copy.
            versioned_status = statuses[-1] if statuses and statuses[-1] == versioned else versioned
        self._known[key] = _Known(uid, statuses, record, phase, versions, versioned_status)

    async def _write_status(self, key: Key, cr: dict[str, Any], current: _Current, desired: dict[str, Any]) -> None:
        self.phases.set(key, desired.get("phase"))
        previous = current.status
        uid = (cr.get("metadata") or {}).get("uid") or ""
        if desired == previous:
            return
        patch = _status_patch(previous, desired)
        # A job with no status at all yet gets the status object itself (its keys cannot be set
        # one by one under a missing parent).
        whole = not previous and not (cr.get("status") or {})
        written = await self._blocking(self.kube.patch_status, key[0], key[1], uid, patch, whole=whole)
        known = self._known.get(key)
        # The phase this operator last announced, if it knows it: a status someone else wrote,
        # or an index that lags, is no reason for a second Event.
        old_phase = known.phase if known is not None and known.uid == uid and known.phase else previous.get("phase")
        current.status = desired
        self._remember(key, uid, current, status=desired, written=written)
        new_phase = desired.get("phase")
        if new_phase in derive.TERMINAL_PHASES:
            self.wake_up()
        if old_phase != new_phase:
            self._post_event(
                key,
                cr,
                "Warning" if new_phase in _WARNING_PHASES else "Normal",
                str(new_phase),
                desired.get("message") or f"phase {new_phase}",
            )
            self.logger.info("%s/%s: %s -> %s: %s", key[0], key[1], old_phase, new_phase, desired.get("message"))
        running = condition_of(desired, "Running") or {}
        if running.get("reason") in _WARNING_REASONS and running.get("reason") != _running_reason(previous):
            # A problem the phase does not show (it stays Starting): announced once, when it appears.
            self._post_event(key, cr, "Warning", str(running["reason"]), str(running.get("message") or ""))
            self.logger.info("%s/%s: %s: %s", key[0], key[1], running["reason"], running.get("message"))

    def _post_event(self, key: Key, cr: dict[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            kopf.event(_event_target(cr), type=type_, reason=reason, message=message[:1024])
        except LookupError:  # outside kopf's handler context (no posting queue): status is enough
            self.logger.debug("no event posted for %s/%s: outside a handler context", *key)

    # -- blocking API work (executor threads) ----------------------------------------------------

    def _render(self, parsed: ParsedSpec, cr: dict[str, Any]) -> list[dict[str, Any]]:
        from colocgrpo_operator.render import render_children

        children = render_children(parsed.job_model(cr), default_image=self.default_image)
        owner = _event_target(cr)
        for child in children:
            child.setdefault("metadata", {}).setdefault("namespace", owner.metadata.namespace)
            kopf.adopt(child, owner=owner)
        return children

    async def _apply_children(self, rendered: list[dict[str, Any]], new_job: bool, alongside: Any = None) -> None:
        """Everything but the Job, server-side applied (creates or updates, idempotently), all at
        once: they do not depend on each other, and each is an API round trip of its own. One
        after another, they were most of a new job's time to its Job on a loaded API server
        (five round trips of the seven before it). `alongside` (a coroutine: a new job's first
        record) runs at the same time, and its failure is raised like a child's, first.

        Every child is tried before the first failure (in render order) is raised; the Job
        waits for all of them (its pods need the ConfigMap and the ServiceAccount).
        """
        children = [c for c in rendered if c.get("kind") != "Job"]
        outcomes = await asyncio.gather(
            *([alongside] if alongside is not None else []),
            *(self._blocking(self._apply_child, child, new_job) for child in children),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _apply_child(self, child: dict[str, Any], new_job: bool) -> None:
        """One child, not the Job. For a job never reconciled before (no status yet) a plain create
        is tried first: it is the common case and cheaper for the API server than an apply; a 409
        falls back to the apply. The Job is never applied: its pod template is immutable and its
        spec.suspend may belong to Kueue, so it is only ever created (see _create_job) and its
        suspend patched on purpose."""
        if new_job and self.kube.create(child):
            return
        try:
            self.kube.apply(child)
        except KubeApiError as error:
            if error.status == 422 and _SECOND_CONTROLLER in error.message:
                raise PredecessorPending(f"{child['kind']} {child['metadata']['name']}") from error
            raise

    def _create_job(
        self, job: dict[str, Any], facts: derive.RunFacts, record: Record, now: datetime
    ) -> dict[str, Any] | None:
        """Create the rendered batch Job (its deadline shortened to what the job has left)."""
        # A recreated gang gets what is left of the job's deadline, not a fresh one.
        remaining = derive.remaining_deadline(facts, record, now)
        if remaining is not None:
            job.setdefault("spec", {})["activeDeadlineSeconds"] = max(remaining, 1)
        return self.kube.create_returning(job)


def _version_of(obj: Mapping[str, Any] | None) -> str | None:
    version = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) and version else None


def owned_by(obj: dict[str, Any], uid: str | None) -> bool:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return not owners or any(isinstance(o, dict) and o.get("uid") == uid for o in owners)


def _event_target(cr: dict[str, Any]) -> kopf.Body:
    """The job as kopf's Events and owner references need it: its identity, nothing else."""
    meta = cr.get("metadata") or {}
    return kopf.Body(
        kopf.RawBody(
            apiVersion=cr.get("apiVersion") or "colocgrpo.io/v1alpha1",
            kind=cr.get("kind") or "ColocGRPOJob",
            metadata={
                "name": str(meta.get("name") or ""),
                "namespace": str(meta.get("namespace") or ""),
                "uid": str(meta.get("uid") or ""),
                "labels": dict(meta.get("labels") or {}),
            },
        )
    )
