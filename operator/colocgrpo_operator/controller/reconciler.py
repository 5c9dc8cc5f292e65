"""One reconcile of one ColocGRPOJob: decide (pure, controller/status.py), then act.

Every trigger ends up here through the scheduler (controller/scheduling.py), which serializes
the reconciles of one job. Decisions are level-based (derived from what exists now), which is
what makes an operator killed at any point safe to restart:

- children have deterministic names, so re-creating one is a 409 (no duplicate Job);
- a gang restart is recorded (restarts, lastFailure.jobUid) *before* the failed Job is
  deleted, and a failure of a Job uid already recorded is never counted twice;
- the operator's record on the job's metadata (record.py) is the only memory, apart from
  caches that can be rebuilt: the parsed specs (specs.py) and the ledger of the operator's own
  writes (ledger.py). The status shows the record, but is never read back as the truth: the
  trainer may write the status subresource.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from colocgrpo_operator.api import KIND
from colocgrpo_operator.api.naming import JOB_NAME_LABEL, RECORD_ANNOTATION
from colocgrpo_operator.api.runtime import job_runtime_ref, runtime_label
from colocgrpo_operator.controller import status as derive
from colocgrpo_operator.controller.conditions import condition_of, set_condition
from colocgrpo_operator.controller.ledger import Current, WriteLedger
from colocgrpo_operator.controller.objects import owned_by
from colocgrpo_operator.controller.progress_clock import StepClock
from colocgrpo_operator.controller.record import Record, RecordExtras, RuntimeSnapshot
from colocgrpo_operator.controller.scheduling import PredecessorPending, ReconcileScheduler, Request
from colocgrpo_operator.controller.snapshots import Inputs, Key, batch_job_snapshot
from colocgrpo_operator.controller.specs import ParsedSpec, SpecCache
from colocgrpo_operator.controller.workers import creation_refusal
from colocgrpo_operator.kube.client import KubeApi, KubeApiError
from colocgrpo_operator.metrics import GANG_RESTARTS, PROGRESS_DEADLINES, PhaseBook

# Phases worth a Warning event; the rest are Normal.
_WARNING_PHASES = frozenset({derive.RESTARTING, derive.FAILED})
# (condition, reason) worth a Warning event of their own when it appears, whatever the phase does.
_WARNING_CONDITIONS = (("Running", derive.POD_CREATION_FAILED), ("Progressing", derive.PROGRESS_DEADLINE_EXCEEDED))
# The Event a gang (re)started from another generation of its runtime than the last one is announced by.
RUNTIME_UPDATED = "RuntimeUpdated"
# Every kind of child the operator may render besides the batch Job (render/), each labelled
# with the job's name and named after it.
_CHILD_KINDS = ("ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding")
# The API server's answer when an apply would give a child a second controller owner.
_SECOND_CONTROLLER = "Only one reference can have Controller set to true"

# Posts an Event about a job: (the job as the reconcile read it, type, reason, message).
PostEvent = Callable[[Mapping[str, Any], str, str, str], None]
# Makes rendered children the job's own, in place: (the children, the job); each gets the job as
# its controller owner, the job's namespace and the job's labels where it has none of its own.
Adopt = Callable[[list[dict[str, Any]], Mapping[str, Any]], None]


class FirstRecord:
    """The record one reconcile decides with, and the write of the job's first one (or of the
    runtime snapshot a new gang is made from).

    Every job gets its record before its first batch Job, so no trainer runs without one
    (record.py); a job an earlier operator started has its record in the status. A job without one
    yet has it written together with its other children (one round trip less before the Job), and
    in any case before the Job is created or anything else is done: `write` may be called at each
    of those points, and writes once. The same holds for the runtime snapshot of a gang about to
    be (re)created: it is in the record before the Job is.

    Args:
        current: what the reconcile takes to be in place; a write of the record updates it.
        write: patches a record onto the job (and updates `current`).
        runtime: the runtime snapshot this reconcile merges the job with (None: it names none).
    """

    def __init__(
        self,
        current: Current,
        write: Callable[[Record], Awaitable[None]],
        runtime: RuntimeSnapshot | None = None,
    ):
        self._current = current
        self._write = write
        self._runtime = runtime
        status = current.status
        self._first = Record.from_status(status) if current.record is None and status.get("phase") else Record()

    def record(self) -> Record:
        """The job's record, or the first one it is about to get, with this reconcile's runtime."""
        base = self._current.record if self._current.record is not None else self._first
        return base if base.runtime == self._runtime else dataclasses.replace(base, runtime=self._runtime)

    async def write(self) -> None:
        """Write the first record, or the new runtime snapshot, unless the job has it by now."""
        if self._current.record is None or self._current.record.runtime != self._runtime:
            await self._write(self.record())


@dataclasses.dataclass(frozen=True)
class _Evidence:
    """What one reconcile judges a valid job by, apart from its batch Job and record: the pods of
    that Job only, the job's Kueue Workloads, the status it starts from, the trainer's progress."""

    facts: derive.RunFacts
    plan_warning: tuple[bool, str, str] | None
    pods: list[dict[str, Any]]
    workloads: list[dict[str, Any]]
    previous: dict[str, Any]
    progress: Any
    step_since: datetime | None
    step_moved: bool
    now: datetime
    generation: Any

    def decide(
        self, batch_job: dict[str, Any] | None, record: Record, refusal: str | None = None
    ) -> tuple[derive.Assessment, dict[str, Any]]:
        """The assessment (controller/status.py) and the status to write, the plan warning in it."""
        assessment = derive.assess(
            self.facts,
            batch_job,
            self.pods,
            record,
            self.previous,
            self.now,
            self.progress,
            self.workloads,
            refusal,
            self.step_since,
            self.step_moved,
        )
        desired = assessment.status
        if self.plan_warning is not None:
            warn, reason, message = self.plan_warning
            conditions = set_condition(
                desired.get("conditions", []), "PlanWarning", warn, reason, message, self.now, self.generation
            )
            desired = dict(desired, conditions=conditions)
        return assessment, desired


class Reconciler:
    """Every reconcile of every job goes through one instance (`OperatorRuntime.reconciler`).

    Guarantees: reconciles of one job never overlap (its `schedule`); blocking API calls run in
    `executor`, never on the event loop; the status is only written when it changed, and never its
    `progress` (the trainer's).

    Args:
        kube: the blocking API client.
        default_image: trainer image for jobs whose spec names none (None: the renderer's default).
        executor: where blocking API calls run (kopf's executor, `--api-threads` threads).
        logger: phase transitions, gang restarts and background failures.
        post_event: posts an Event about a job (the operator's: kopf's poster, kopf_glue/owner.py).
        adopt: makes rendered children the job's own (the operator's: kopf's, kopf_glue/owner.py).

    Attributes:
        schedule: when reconciles run (scheduling.py); the housekeeping loop's wake-ups too.
        ledger: the operator's own last writes of each job (ledger.py).
        specs: every job's spec, parsed once per generation (specs.py).
        steps: when each job's training step last moved (progress_clock.py).
        phases: every job's last phase, for the phase gauge.
    """

    def __init__(
        self,
        kube: KubeApi,
        default_image: str | None,
        executor: concurrent.futures.Executor,
        logger: logging.Logger,
        *,
        post_event: PostEvent,
        adopt: Adopt,
    ):
        self.kube = kube
        self.default_image = default_image
        self.executor = executor
        self.logger = logger
        self.post_event = post_event
        self.adopt = adopt
        self.phases = PhaseBook()
        self.schedule = ReconcileScheduler(self._reconcile_locked, logger)
        self.ledger = WriteLedger()
        self.specs = SpecCache()
        self.steps = StepClock()
        self._events_refused = False  # warned once that Events cannot be listed

    # -- entry points --------------------------------------------------------------------------------

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
        """Bring one job's children and status in line with the world, now
        (`ReconcileScheduler.reconcile`; `Request` says what the arguments mean). Raises on API
        errors."""
        await self.schedule.reconcile(key, read_inputs, Request(trigger, ensure_children, fresh_cr, record_extras))

    def reconcile_soon(self, key: Key, read_inputs: Callable[[], Inputs], *, trigger: str) -> None:
        """A coalescible reconcile in a task of its own (`ReconcileScheduler.reconcile_soon`)."""
        self.schedule.reconcile_soon(key, read_inputs, Request(trigger))

    def forget(self, key: Key) -> None:
        """The job is gone: drop its lock, its ledger and its phase from the gauge."""
        self.schedule.forget(key)
        self.ledger.forget(key)
        self.steps.forget(key)
        self.phases.set(key, None)

    async def delete_job(self, key: Key, uid: str | None) -> bool:
        """Delete the ColocGRPOJob itself (only that exact object when `uid` is given; its
        children go by garbage collection), in an executor thread. Returns False when it is
        already gone or has been replaced by another of the same name; raises KubeApiError
        on any other refusal."""
        deleted: bool = await self._blocking(self.kube.delete, KIND, key[0], key[1], uid=uid)
        return deleted

    async def _blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    # -- decide and act -----------------------------------------------------------------------------

    async def _reconcile_locked(self, key: Key, inputs: Inputs, request: Request) -> None:
        cr, job, pods, workloads = inputs
        if cr is None:
            self.forget(key)
            return
        meta = cr.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # garbage collection removes the children; nothing to decide
        now = datetime.now(UTC)
        current = self.ledger.current(key, cr)
        runtime, missing = await self._runtime_of(key, cr, job, current)
        if missing is not None:
            desired = derive.invalid_spec_status(
                current.record_or_empty(),
                current.status,
                [missing],
                now,
                meta.get("generation"),
                reason=derive.RUNTIME_NOT_FOUND,
            )
            await self._write_status(key, cr, current, desired)
            return
        parsed = self.specs.parsed(cr, runtime)
        if parsed.warnings and not parsed.warned:
            # Once per parse (per generation), not per reconcile: a deprecated field, say.
            parsed.warned = True
            for path, message in parsed.warnings:
                self.post_event(cr, "Warning", "DeprecatedField", f"{path}: {message}")
        if parsed.facts is None:
            desired = derive.invalid_spec_status(
                current.record_or_empty(), current.status, parsed.problems, now, meta.get("generation")
            )
            await self._write_status(key, cr, current, desired)
            return
        # A Job of the same name that this job does not own (a predecessor with the same name
        # still being garbage-collected) is not ours to judge; creating ours waits for it. One of
        # a deleted job of the same name is removed at once (`_predecessors`).
        if job is not None and not owned_by(job, meta.get("uid")):
            if _predecessors(job, cr):
                await self._blocking(self._delete_predecessors, "Job", key[0], job)
            job = None
        # Only pods of this incarnation's Job are its evidence: a predecessor's pod failing in
        # flight must not count as this job's failure.
        job_uid = (job.get("metadata") or {}).get("uid") if job is not None else None
        step_since, step_moved = self.steps.observe(key, cr, now)
        evidence = _Evidence(
            facts=parsed.facts,
            plan_warning=parsed.plan_warning,
            pods=[p for p in pods if job_uid is not None and owned_by(p, job_uid)],
            workloads=workloads,
            previous=current.status,
            progress=(cr.get("status") or {}).get("progress"),
            step_since=step_since,
            step_moved=step_moved,
            now=now,
            generation=meta.get("generation"),
        )
        first = FirstRecord(
            current, functools.partial(self._write_record, key, cr, current, extras=request.record_extras), runtime
        )
        assessment, desired = evidence.decide(job, first.record())
        if assessment.check_pod_creation and job_uid is not None:
            # The Job lacks pods past the grace period: ask the Job controller's Events why.
            refusal = await self._creation_refusal(key, job_uid)
            if refusal is not None:
                assessment, desired = evidence.decide(job, first.record(), refusal)
        if await self._namespace_going(key, evidence, assessment, desired):
            # Nothing a user could act on: the job goes with its namespace.
            self.logger.debug("%s/%s: its namespace is being deleted; nothing to judge", *key)
            return
        creating = assessment.action is derive.Action.CREATE_JOB
        try:
            assessment, desired = await self._ensure_objects(
                key, cr, parsed, evidence, first, assessment, desired, request.ensure_children
            )
        except KubeApiError as error:
            if error.status not in (400, 422):
                raise
            # The API server refused a child rendered from this spec (e.g. a malformed toleration
            # or env entry in a free-form field): the spec is the problem and retrying cannot
            # help, so say so the way an invalid spec is reported.
            problems = [("spec", f"the API server refused a child object: {error.message}")]
            await first.write()
            desired = derive.invalid_spec_status(
                current.record_or_empty(), evidence.previous, problems, now, evidence.generation
            )
            await self._write_status(key, cr, current, desired)
            return
        # Record before acting: a restart is counted before the failed Job is deleted.
        recorded = _newly_recorded(first.record(), assessment.record)
        await self._write_record(key, cr, current, assessment.record)
        if recorded:
            self._count_restart(key, assessment)
        await self._write_status(key, cr, current, desired)
        if assessment.record.finished:
            # Its TTL may wait for the batch Job to finish: a change of that Job is a reason to look.
            self.schedule.wake_up()
        if not creating:  # (a Job just created has nothing more to be done to it)
            await self._act_on_job(key, job, assessment)

    async def _runtime_of(
        self, key: Key, cr: dict[str, Any], job: dict[str, Any] | None, current: Current
    ) -> tuple[RuntimeSnapshot | None, tuple[str, str] | None]:
        """The runtime snapshot the job is merged with, or the problem of a runtime that is not
        there: (None, None) for a job that names none.

        While a gang of the job exists (or once the job has finished), the snapshot in its record:
        editing a runtime never changes a running gang. Before a gang is (re)created, the runtime
        as it is now, read from the API server (one GET); a generation other than the recorded
        one is announced with a `RuntimeUpdated` Event, and goes into the record before the new
        gang's Job is created (`FirstRecord`)."""
        ref = job_runtime_ref(cr)
        if ref is None:
            return None, None
        kind, name = ref
        meta = cr.get("metadata") or {}
        record = current.record
        recorded = record.runtime if record is not None else None
        kept = recorded is not None and (recorded.kind, recorded.name) == ref
        gang = job is not None and owned_by(job, meta.get("uid"))
        if recorded is not None and kept and (gang or (record is not None and record.finished)):
            return recorded, None
        where = runtime_label(kind, name, key[0])
        found = await self._blocking(self.kube.get, kind, key[0], name)
        if found is None:
            return None, ("spec.runtimeRef", f"{where} not found; the job starts once it exists")
        runtime = RuntimeSnapshot.of(found)
        if recorded is not None and kept and not runtime.same_object(recorded):
            self.post_event(
                cr,
                "Normal",
                RUNTIME_UPDATED,
                f"the next gang is made from {where} generation {runtime.generation} "
                f"(the last one from generation {recorded.generation})",
            )
        return runtime, None

    async def _namespace_going(
        self, key: Key, evidence: _Evidence, assessment: derive.Assessment, desired: dict[str, Any]
    ) -> bool:
        """Whether the job's namespace is being deleted, asked (one GET) only of a job already under
        way whose reconcile would do or announce something: judge a failure, act on its batch Job,
        change its phase, or raise a warning condition. A namespace teardown deletes the pods
        first, then the Jobs, then the job itself, and each step looks like a failure or a
        change of phase: none of it is the job's to count, write or announce (and a namespace
        being deleted refuses new Events: kopf's poster would log every retry of each)."""
        previous = evidence.previous
        if not previous:
            return False  # a new job: its creates are refused in a terminating namespace (scheduling.py)
        going = any((p.get("metadata") or {}).get("deletionTimestamp") for p in evidence.pods)
        acting = assessment.action not in (derive.Action.NONE, derive.Action.CREATE_JOB)
        if not (going or acting or assessment.failure is not None or _announced(previous, desired)):
            return False
        terminating: bool = await self._blocking(self.kube.namespace_terminating, key[0])
        return terminating

    async def _ensure_objects(
        self,
        key: Key,
        cr: dict[str, Any],
        parsed: ParsedSpec,
        evidence: _Evidence,
        first: FirstRecord,
        assessment: derive.Assessment,
        desired: dict[str, Any],
        ensure_children: bool,
    ) -> tuple[derive.Assessment, dict[str, Any]]:
        """The job's first record, its children (when asked to, or when its Job is about to be
        created) and its batch Job (when the assessment says so), in that order. Returns the
        assessment and status to write: judged again from the Job just created, if one was."""
        action = assessment.action
        creating = action is derive.Action.CREATE_JOB
        # A Job about to be (re)created gets every other child first: a job revived after its
        # children were refused or went missing would otherwise run without them.
        apply = (ensure_children or creating) and desired.get("phase") not in derive.TERMINAL_PHASES
        if apply or creating:
            # One render for the children and the Job (it builds the typed job's every object).
            rendered = await self._blocking(self._render, parsed, cr)
            if apply:
                new_job = not evidence.previous
                alongside = [first.write()]
                if new_job:  # once per incarnation, while its children are applied
                    alongside.append(self._sweep_predecessors(key, cr, {c.get("kind") for c in rendered}))
                await self._apply_children(rendered, new_job, *alongside)
            await first.write()
            if creating:
                job_object = next(c for c in rendered if c.get("kind") == "Job")
                created = await self._blocking(
                    self._create_job, job_object, evidence.facts, assessment.record, evidence.now
                )
                if created is not None:
                    self.logger.info("created the gang's batch Job %s/%s", *key)
                    # Judge from the Job just created, not from "no Job yet": saves writing a
                    # Pending status that the Job's first watch event would overwrite at once.
                    return evidence.decide(batch_job_snapshot(created), first.record())
        await first.write()
        return assessment, desired

    def _count_restart(self, key: Key, assessment: derive.Assessment) -> None:
        """Count and log the gang restart whose failure this reconcile has just recorded: once, as
        the record counts it. A later reconcile that still sees the failed Job (its deletion waits
        for its pods, and for Kueue's Workload) deletes it again, and the API server answers that
        delete like the first: counting deletes counted such a restart twice."""
        failure = assessment.failure
        if assessment.action is derive.Action.RESTART_GANG and failure is not None:
            GANG_RESTARTS.labels(counted=str(failure.counted).lower()).inc()
            self.logger.warning("%s/%s: gang restart after %s: %s", key[0], key[1], failure.reason, failure.message)

    async def _act_on_job(self, key: Key, job: dict[str, Any] | None, assessment: derive.Assessment) -> None:
        """What the assessment says to do to the existing batch Job, once record and status say it."""
        action = assessment.action
        uid = (job.get("metadata") or {}).get("uid") if job is not None else None
        if action is derive.Action.RESTART_GANG and job is not None:
            await self._blocking(self.kube.delete, "Job", key[0], key[1], propagation="Foreground", uid=uid)
        elif action is derive.Action.STOP_JOB and job is not None:
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

    # -- the job's own writes ------------------------------------------------------------------------

    async def _write_record(
        self, key: Key, cr: dict[str, Any], current: Current, record: Record, extras: RecordExtras | None = None
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
        self.ledger.remember(key, uid, current, status=None, written=written)

    async def _write_status(self, key: Key, cr: dict[str, Any], current: Current, desired: dict[str, Any]) -> None:
        """Patch the job's status (never its progress) when it differs from `current`'s, and
        announce a new phase, or a problem the phase does not show, with an Event."""
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
        # The phase this operator last announced, if it knows it: a status someone else wrote,
        # or an index that lags, is no reason for a second Event.
        old_phase = self.ledger.announced_phase(key, uid) or previous.get("phase")
        current.status = desired
        self.ledger.remember(key, uid, current, status=desired, written=written)
        new_phase = desired.get("phase")
        if new_phase in derive.TERMINAL_PHASES:
            self.schedule.wake_up()
        if old_phase != new_phase:
            self.post_event(
                cr,
                "Warning" if new_phase in _WARNING_PHASES else "Normal",
                str(new_phase),
                desired.get("message") or f"phase {new_phase}",
            )
            self.logger.info("%s/%s: %s -> %s: %s", key[0], key[1], old_phase, new_phase, desired.get("message"))
        for type_, reason in _WARNING_CONDITIONS:
            # A problem the phase does not show, or not by itself: announced once, when it appears.
            condition = condition_of(desired, type_) or {}
            if condition.get("reason") != reason or _reason(previous, type_) == reason:
                continue
            message = str(condition.get("message") or "")
            self.post_event(cr, "Warning", reason, message)
            self.logger.info("%s/%s: %s: %s", key[0], key[1], reason, message)
            if reason == derive.PROGRESS_DEADLINE_EXCEEDED:
                PROGRESS_DEADLINES.inc()

    # -- children (blocking parts run in executor threads) -------------------------------------------

    def _render(self, parsed: ParsedSpec, cr: dict[str, Any]) -> list[dict[str, Any]]:
        from colocgrpo_operator.render import render_children

        children = render_children(parsed.job_model(cr), default_image=self.default_image)
        namespace = str((cr.get("metadata") or {}).get("namespace") or "")
        for child in children:
            child.setdefault("metadata", {}).setdefault("namespace", namespace)
        self.adopt(children, cr)
        return children

    async def _apply_children(
        self, rendered: list[dict[str, Any]], new_job: bool, *alongside: Coroutine[Any, Any, None]
    ) -> None:
        """Everything but the Job, server-side applied (creates or updates, idempotently), all at
        once: they do not depend on each other, and each is an API round trip of its own. One
        after another, they were most of a new job's time to its Job on a loaded API server.
        `alongside` (a new job's first record and its sweep of a predecessor's leftovers) runs
        at the same time, and a failure there is raised like a child's, first.

        Every child is tried before the first failure (in render order) is raised; the Job
        waits for all of them (its pods need the ConfigMap and the ServiceAccount).
        """
        children = [c for c in rendered if c.get("kind") != "Job"]
        outcomes = await asyncio.gather(
            *alongside,
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
                meta = child["metadata"]
                existing = self.kube.get(child["kind"], meta["namespace"], meta["name"])
                if existing is not None and _predecessors(existing, _owner_of(child)):
                    self._delete_predecessors(child["kind"], meta["namespace"], existing)
                raise PredecessorPending(f"{child['kind']} {meta['name']}") from error
            raise

    def _delete_predecessors(self, kind: str, namespace: str, obj: dict[str, Any]) -> None:
        """Delete a child of a deleted job of the same name (that very object: a uid precondition).
        The garbage collector would, but it can miss such an owner for good: replaced under the
        same name while its watch was down (an API server restart), the owner never looks deleted
        to it, and the new job would wait forever. A Job goes in the foreground (its pods first)."""
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # already going (a foreground deletion waits for the garbage collector)
        name = str(meta.get("name") or "")
        propagation = "Foreground" if kind == "Job" else "Background"
        if self.kube.delete(kind, namespace, name, propagation=propagation, uid=meta.get("uid")):
            self.logger.info("%s: removed %s %s of a deleted job of the same name", namespace, kind, name)

    async def _sweep_predecessors(self, key: Key, cr: dict[str, Any], rendered_kinds: set[Any]) -> None:
        """Delete the children a deleted job of the same name left behind of the kinds this new
        job does not render (each kind at once): a 2-node predecessor's Service, say, under a
        1-node successor. The kinds it renders have the same names in every incarnation, and
        `_apply_child` deletes a predecessor's one that gets in the way. The garbage collector
        misses them for good when the owner was replaced under the same name while its watch was
        down (an API server restart): its informer sees one object change, never a deletion."""
        kinds = [kind for kind in _CHILD_KINDS if kind not in rendered_kinds]
        await asyncio.gather(*(self._blocking(self._sweep_kind, kind, key, cr) for kind in kinds))

    def _sweep_kind(self, kind: str, key: Key, cr: dict[str, Any]) -> None:
        namespace, name = key
        for obj in self.kube.list_objects(kind, namespace, f"{JOB_NAME_LABEL}={name}").get("items") or []:
            if _predecessors(obj, cr):
                self._delete_predecessors(kind, namespace, obj)

    def _create_job(
        self, job: dict[str, Any], facts: derive.RunFacts, record: Record, now: datetime
    ) -> dict[str, Any] | None:
        """Create the rendered batch Job (its deadline shortened to what the job has left)."""
        # A recreated gang gets what is left of the job's deadline, not a fresh one.
        remaining = derive.remaining_deadline(facts, record, now)
        if remaining is not None:
            job.setdefault("spec", {})["activeDeadlineSeconds"] = max(remaining, 1)
        return self.kube.create_returning(job)


def _newly_recorded(before: Record, after: Record) -> bool:
    """Whether `after` records a failure of a batch Job that `before` had not recorded."""
    failed = (after.last_failure or {}).get("jobUid")
    return failed is not None and failed != (before.last_failure or {}).get("jobUid")


def _announced(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` over `previous` posts an Event (`Reconciler._write_status`)."""
    if desired.get("phase") != previous.get("phase"):
        return True
    return any(
        _reason(desired, type_) == reason and _reason(previous, type_) != reason
        for type_, reason in _WARNING_CONDITIONS
    )


def _reason(status: Mapping[str, Any], type_: str) -> Any:
    return (condition_of(dict(status), type_) or {}).get("reason")


def _predecessors(obj: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether `obj` belongs to a ColocGRPOJob of `job`'s name but another uid, and not to `job`: a
    deleted predecessor's (names are unique, so that job is gone)."""
    meta = job.get("metadata") or {}
    owners = [o for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if isinstance(o, Mapping)]
    return not any(o.get("uid") == meta.get("uid") for o in owners) and any(
        o.get("kind") == KIND and o.get("name") == meta.get("name") for o in owners
    )


def _owner_of(child: Mapping[str, Any]) -> dict[str, Any]:
    """The job a rendered child is adopted by (its ColocGRPOJob owner reference), as a job's metadata."""
    owners = (child.get("metadata") or {}).get("ownerReferences") or []
    owner = next((o for o in owners if isinstance(o, Mapping) and o.get("kind") == KIND), {})
    return {"metadata": {"name": owner.get("name"), "uid": owner.get("uid")}}


def _status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning `current` into `desired`: removed keys become null; never progress."""
    patch = {k: v for k, v in desired.items() if k != "progress"}
    for key in current:
        if key != "progress" and key not in desired:
            patch[key] = None
    return patch
