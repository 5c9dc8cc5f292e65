"""What is really happening to a ColocGRPOJob, derived from the objects Kubernetes shows.

Everything here is pure: (the job's run facts, its batch/v1 Job, the Job's pods, the previous
status, now) in, (the new status, the one action the operator must take) out. The kopf
handlers only gather the inputs from their indices and carry out the action, so every
decision about phases, reasons and restarts is unit-tested without a cluster.

The pieces live beside it: why a gang failed (failures.py), how the workers stand
(workers.py), how conditions are kept (conditions.py). The status written here never
contains `progress`: that subtree belongs to the trainer.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Any

from colocgrpo_operator.api import Phase
from colocgrpo_operator.api.model import FIRST_STEP_ALLOWANCE_SECONDS
from colocgrpo_operator.controller.conditions import condition_of, set_condition
from colocgrpo_operator.controller.failures import Failure, classify_failure
from colocgrpo_operator.controller.kueue import (
    NO_QUEUE_NAME,
    NO_QUEUE_NAME_MESSAGE,
    SUSPEND_MESSAGE,
    kueue_queue,
    kueue_wait,
    workload_of,
)
from colocgrpo_operator.controller.objects import (
    as_list,
    completion_index,
    dig,
    format_time,
    job_condition,
    parse_time,
    pods_of_job,
    truncate,
)
from colocgrpo_operator.controller.record import Outcome, Record, RuntimeSnapshot
from colocgrpo_operator.controller.workers import has_exited_cleanly, is_fully_running, waiting_reason, workers_of

# Phases as plain strings (the API enum's values), so they compare, hash and format exactly
# like the strings read back from Kubernetes.
PENDING = Phase.PENDING.value
QUEUED = Phase.QUEUED.value
SUSPENDED = Phase.SUSPENDED.value
STARTING = Phase.STARTING.value
RUNNING = Phase.RUNNING.value
RESTARTING = Phase.RESTARTING.value
SUCCEEDED = Phase.SUCCEEDED.value
FAILED = Phase.FAILED.value
# A tuple, not a set: `phase in TERMINAL_PHASES` must be False, not a TypeError, for whatever a
# status read from the cluster holds (an unhashable list, say).
TERMINAL_PHASES = (SUCCEEDED, FAILED)

# (status, reason, message) of a condition, as the derivation decides it.
ConditionState = tuple[bool, str, str]

# How long a started Job may lack pods before the Job controller's FailedCreate Events are worth
# looking up (Assessment.check_pod_creation): it creates a gang's pods within a second or two of
# starting the Job, so a healthy start never pays for the lookup.
POD_CREATION_GRACE_SECONDS = 5
# The Running condition's reason while the Job controller cannot create the gang's pods.
POD_CREATION_FAILED = "PodCreationFailed"
# The Progressing condition's reason (and the failure's) when a running gang's step stopped moving.
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
# The reason of SpecValid=False: a spec the operator refuses, or one naming a runtime that is not there.
INVALID_SPEC = "InvalidSpec"
RUNTIME_NOT_FOUND = "RuntimeNotFound"


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """The parts of a valid spec that status derivation needs (built from the API model)."""

    nodes: int
    gpus_per_node: int = 0
    max_restarts: int = 3
    suspend: bool = False
    queue_name: str | None = None
    stall_timeout_seconds: int | None = None
    active_deadline_seconds: int | None = None
    generation: int | None = None
    progress_deadline_seconds: int = 0  # 0: off


class Action(enum.StrEnum):
    NONE = "None"
    CREATE_JOB = "CreateJob"  # no batch Job exists and one should
    RESTART_GANG = "RestartGang"  # delete the failed Job (its pods go with it); recreated once gone
    SUSPEND_JOB = "SuspendJob"  # set the Job's spec.suspend to true
    RESUME_JOB = "ResumeJob"  # set it to false (never when Kueue manages admission)
    STOP_JOB = "StopJob"  # delete a Kueue-managed Job the user suspended (see assess)


@dataclasses.dataclass(frozen=True)
class Assessment:
    status: dict[str, Any]
    record: Record
    action: Action = Action.NONE
    failure: Failure | None = None
    # The Job has been started for POD_CREATION_GRACE_SECONDS and still lacks some of its pods:
    # the caller looks up why (the Job's FailedCreate Events) and derives again with the answer.
    check_pod_creation: bool = False

    @property
    def phase(self) -> str:
        phase: str = self.status["phase"]
        return phase


# ----------------------------------------------------------------------------- invalid specs


def invalid_spec_status(
    record: Record,
    previous: dict[str, Any] | None,
    problems: list[tuple[str, str]],
    now: datetime,
    generation: int | None,
    reason: str = INVALID_SPEC,
) -> dict[str, Any]:
    """Status of a job whose spec the operator refuses: Failed/InvalidSpec, naming each field; or,
    with `reason` RuntimeNotFound, Pending while the runtime its spec names does not exist (it is
    waiting, not failed: `kubectl wait --for=condition=Failed` must not fire for it).

    Not final: fixing the spec (or creating the runtime) revives the job, so nothing of it goes
    into the record."""
    message = "; ".join(f"{path}: {text}" for path, text in problems) or "the spec is invalid"
    waiting = reason == RUNTIME_NOT_FOUND
    conditions = previous_conditions(previous, now)
    conditions = set_condition(conditions, "SpecValid", False, reason, message, now, generation)
    conditions = set_condition(
        conditions,
        "Running",
        False,
        reason,
        "no pods are created until the runtime exists" if waiting else "no pods are created for an invalid spec",
        now,
        generation,
    )
    if waiting:
        conditions = set_condition(conditions, "Failed", False, reason, "waiting for the runtime", now, generation)
    else:
        conditions = set_condition(conditions, "Failed", True, reason, message, now, generation)
    status = _recorded(record)
    # No pods exist for an invalid spec: zero workers, so `kubectl get cgj` shows GPUs 0, not blank.
    status.update(
        phase=PENDING if waiting else FAILED,
        message=truncate(f"waiting for its runtime: {message}" if waiting else f"invalid spec: {message}"),
        conditions=conditions,
        observedGeneration=generation,
        workers=workers_of([], 0),
    )
    return {k: v for k, v in status.items() if v is not None}


def previous_conditions(previous: dict[str, Any] | None, now: datetime) -> list[dict[str, Any]]:
    """The conditions of the current status, for when each last changed (set_condition keeps a
    condition's lastTransitionTime while its status holds). Nothing else of the current status is
    read back: others can write it. A transition time that is not a time, or lies in the future,
    is not kept (a forged one could hold off stall detection)."""
    kept = []
    for condition in as_list((previous or {}).get("conditions")):
        if not isinstance(condition, dict):
            continue
        moment = parse_time(condition.get("lastTransitionTime"))
        if moment is None or moment > now:
            condition = {k: v for k, v in condition.items() if k != "lastTransitionTime"}
        kept.append(condition)
    return kept


def _recorded(record: Record) -> dict[str, Any]:
    """The status fields that show the operator's record."""
    return {
        "restarts": record.restarts,
        "disruptions": record.disruptions,
        "startTime": record.start_time,
        "completionTime": record.completion_time,
        "lastFailure": record.last_failure,
        "runtime": record.runtime.status() if record.runtime is not None else None,
    }


# ----------------------------------------------------------------------------- the builder


@dataclasses.dataclass
class _StatusBuilder:
    """The status being derived in one `assess`: what the derivation has learned so far (the
    record's counters and times as they stand now, the action), turned into the status and the
    new record by `build` once the phase is known."""

    facts: RunFacts
    now: datetime
    conditions: list[dict[str, Any]]
    restarts: int
    disruptions: int
    last_failure: dict[str, Any] | None
    workers: dict[str, int]
    rank0_pod: str | None
    start_time: str | None
    completion_time: str | None
    runtime: RuntimeSnapshot | None = None
    action: Action = Action.NONE
    failure: Failure | None = None
    check_pod_creation: bool = False

    @classmethod
    def start(
        cls,
        facts: RunFacts,
        record: Record,
        previous: dict[str, Any] | None,
        current_pods: list[dict[str, Any]],
        now: datetime,
    ) -> _StatusBuilder:
        rank0 = next(
            (p for p in current_pods if completion_index(p) == 0 and not dig(p, "metadata", "deletionTimestamp")),
            None,
        )
        conditions = set_condition(
            previous_conditions(previous, now), "SpecValid", True, "Valid", "the spec is valid", now, facts.generation
        )
        return cls(
            facts=facts,
            now=now,
            conditions=conditions,
            restarts=record.restarts,
            disruptions=record.disruptions,
            last_failure=record.last_failure,
            workers=workers_of(current_pods, facts.gpus_per_node),
            rank0_pod=dig(rank0, "metadata", "name"),
            start_time=record.start_time,
            completion_time=record.completion_time,
            runtime=record.runtime,
        )

    def _set(self, type_: str, state: ConditionState) -> None:
        status, reason, message = state
        self.conditions = set_condition(
            self.conditions, type_, status, reason, message, self.now, self.facts.generation
        )

    def build(
        self,
        phase: str,
        message: str,
        running: ConditionState,
        *,
        failed_reason: str | None = None,
        stalled: ConditionState | None = None,
        queued: ConditionState | None = None,
        progressing: ConditionState | None = None,
    ) -> Assessment:
        """The status in `phase` with its summary `message`, every condition set to agree
        (`queued`: the Queued condition of a QUEUED phase, which says why); a Succeeded or Failed
        phase is final, so it goes into the record as the outcome."""
        facts = self.facts
        self._set("Running", running)
        self._set("Queued", queued if phase == QUEUED and queued else (False, "NotQueued", "not waiting for admission"))
        suspended = phase == SUSPENDED
        self._set(
            "Suspended",
            (
                suspended,
                "SuspendedByUser" if suspended else "NotSuspended",
                "spec.runPolicy.suspend is true: the gang's pods are deleted" if suspended else "not suspended",
            ),
        )
        succeeded = phase == SUCCEEDED
        self._set(
            "Succeeded",
            (
                succeeded,
                "Completed" if succeeded else "NotCompleted",
                message if succeeded else "training has not completed",
            ),
        )
        self._set(
            "Failed",
            (phase == FAILED, failed_reason or "NotFailed", message if phase == FAILED else "no fatal failure"),
        )
        self._set("Stalled", stalled or (False, "NotStalled", "the gang is not running"))
        if progressing is not None:  # set while a gang runs; kept as it was between gangs
            self._set("Progressing", progressing)
        outcome = None
        if phase in TERMINAL_PHASES:
            outcome = Outcome(
                phase=phase,
                reason=failed_reason or "Completed",
                message=truncate(message),
                running_reason=running[1],
                running_message=truncate(running[2]),
            )
        record = Record(
            restarts=self.restarts,
            disruptions=self.disruptions,
            start_time=self.start_time,
            completion_time=self.completion_time,
            last_failure=self.last_failure,
            outcome=outcome,
            runtime=self.runtime,
        )
        status = _recorded(record)
        status.update(
            phase=phase,
            message=truncate(message),
            conditions=self.conditions,
            observedGeneration=facts.generation,
            workers=self.workers,
            rank0Pod=self.rank0_pod,
        )
        status = {k: v for k, v in status.items() if v is not None}
        return Assessment(status, record, self.action, self.failure, self.check_pod_creation)

    def final(self, outcome: Outcome) -> Assessment:
        """The status of a job that has ended, from the outcome the operator recorded then."""
        return self.build(
            outcome.phase,
            outcome.message,
            (False, outcome.running_reason, outcome.running_message),
            failed_reason=outcome.reason if outcome.phase == FAILED else None,
        )


# ----------------------------------------------------------------------------- the derivation


def assess(
    facts: RunFacts,
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    record: Record,
    previous: dict[str, Any] | None,
    now: datetime,
    progress: dict[str, Any] | None = None,
    workloads: list[dict[str, Any]] | None = None,
    creation_refusal: str | None = None,
    step_since: datetime | None = None,
    step_moved: bool = True,
) -> Assessment:
    """Derive the status (without progress), the new record and the operator's next action.

    `job` is the batch/v1 Job named after the ColocGRPOJob (None when absent), `pods` every
    pod labelled with the job's name (pods of older Jobs are filtered out here), `record` the
    operator's own record of the job (record.py: restarts, times, the final outcome), `previous`
    the current status (read only for its conditions' transition times, previous_conditions),
    `progress` the trainer's status.progress (for stall detection), `workloads` Kueue's
    Workloads of batch Jobs of the job's name (of this Job or older ones), `creation_refusal` the
    message of the Job's newest FailedCreate Event, looked up only when an assessment without it
    asked for it (Assessment.check_pod_creation), `step_since` when the operator first saw
    `progress.step` at its current value (for the progress deadline; None before any step), and
    `step_moved` whether it saw the step move there (not for the first step an operator sees).
    """
    current_pods = pods_of_job(job, pods)
    status = _StatusBuilder.start(facts, record, previous, current_pods, now)
    # Read back for one thing only: whether a gap without a Job is a restart or a first start,
    # which changes the phase's name and message, never what is done (others can write it).
    prev_phase = (previous or {}).get("phase") if isinstance(previous, dict) else None

    # A finished job stays finished: its Job may be garbage-collected or its pods cleaned up.
    # Only the operator's own record says it finished; a phase in the status is never read back.
    if record.outcome is not None:
        return status.final(record.outcome)

    if job is None or dig(job, "metadata", "deletionTimestamp"):
        if facts.suspend and kueue_queue(facts.queue_name, job):
            # A Kueue-managed job is suspended by having no Job (see below); none is created.
            return status.build(SUSPENDED, SUSPEND_MESSAGE, (False, "Suspended", "the job is suspended"))
        if job is None:
            if remaining_deadline(facts, record, now) == 0:
                message = (
                    f"the job ran past runPolicy.activeDeadlineSeconds={facts.active_deadline_seconds} "
                    "before its gang could be recreated"
                )
                status.completion_time = format_time(now)
                return status.build(
                    FAILED, message, (False, "DeadlineExceeded", message), failed_reason="DeadlineExceeded"
                )
            # Kueue matches Workloads to Jobs by the Job's name: a new Job created while the previous
            # Job's Workload still exists would run on that Workload's admission until the garbage
            # collector deletes it, and then be stopped. So the new Job waits for it to go.
            leftover = next((w for w in workloads or [] if isinstance(w, dict)), None)
            if leftover is not None:
                message = f"waiting for the previous Job's Kueue Workload {dig(leftover, 'metadata', 'name')} to go"
                phase = RESTARTING if prev_phase == RESTARTING else PENDING
                return status.build(phase, message, (False, "WaitingForWorkloadDeletion", message))
            status.action = Action.CREATE_JOB
        if prev_phase == RESTARTING or job is not None:
            # Between gangs: the failed one is going or gone, the next is not there yet.
            failure_message = (status.last_failure or {}).get("message") or "recreating the gang"
            return status.build(
                RESTARTING,
                f"restarting the gang: {failure_message}",
                (False, "Restarting", "the previous gang is being replaced"),
            )
        return status.build(PENDING, "creating the gang", (False, "Pending", "the batch Job is being created"))

    # Propagate the user's suspend both ways, unless Kueue manages the Job: then resuming is
    # Kueue's admission, and suspending is deleting the Job (below).
    job_suspended = dig(job, "spec", "suspend") is True
    queue = kueue_queue(facts.queue_name, job)
    if facts.suspend and not job_suspended and not queue:
        status.action = Action.SUSPEND_JOB
    elif not facts.suspend and job_suspended and not queue:
        status.action = Action.RESUME_JOB

    # When the gang first started: the Job's startTime, or now if its pods exist before the Job
    # controller got round to writing it (a busy controller-manager writes status late).
    if not status.start_time and not job_suspended and (dig(job, "status", "startTime") or current_pods):
        status.start_time = dig(job, "status", "startTime") or format_time(now)

    complete = job_condition(job, "Complete") or job_condition(job, "SuccessCriteriaMet")
    if complete and job_condition(job, "Complete"):
        status.completion_time = (
            dig(job, "status", "completionTime") or complete.get("lastTransitionTime") or format_time(now)
        )
        return status.build(SUCCEEDED, "training completed", (False, "Completed", "all workers completed"))

    if facts.suspend and queue:
        # Kueue starts every suspended Job whose Workload is admitted, so suspending a Kueue Job
        # would fight it; deleting the Job takes its Workload (and quota) with it, and resuming
        # creates a new Job that queues like any other.
        status.action = Action.STOP_JOB
        return status.build(SUSPENDED, SUSPEND_MESSAGE, (False, "Suspended", "the job is suspended"))

    failure = classify_failure(job, current_pods)
    if failure is not None:
        return _after_failure(status, job, failure)

    if job_suspended:
        if facts.suspend:
            return status.build(
                SUSPENDED, "suspended by spec.runPolicy.suspend", (False, "Suspended", "the job is suspended")
            )
        if queue:
            return _queued(status, job, queue, workload_of(job, workloads or []))
        return status.build(PENDING, "resuming the job", (False, "Resuming", "the batch Job is being resumed"))

    running = [p for p in current_pods if is_fully_running(p)]
    finished = [p for p in current_pods if has_exited_cleanly(p)]
    if finished and len(running) + len(finished) >= facts.nodes:
        # Ranks exit one by one at the end; until the Job says Complete the gang is finishing.
        message = f"{len(finished)}/{facts.nodes} workers completed" + (
            "; the Job is completing" if len(finished) >= facts.nodes else "; the others are finishing"
        )
        return status.build(RUNNING, message, (True, "Finishing", message))
    if len(running) >= facts.nodes:
        running_since = condition_of({"conditions": status.conditions}, "Running")
        since = (
            parse_time(running_since.get("lastTransitionTime"))
            if (running_since and running_since.get("status") == "True")
            else now
        )
        stalled = _stall(facts, progress, since or now, now)
        progressing = _progressing(facts, progress, step_since, step_moved, since or now, now)
        if progressing is not None and not progressing[0]:
            status._set("Progressing", progressing)
            return _after_failure(status, job, Failure(PROGRESS_DEADLINE_EXCEEDED, progressing[2]))
        message = f"{len(running)}/{facts.nodes} workers running"
        if stalled[0]:
            message = f"{message}; {stalled[2]}"
        return status.build(
            RUNNING,
            message,
            (True, "AllWorkersRunning", f"{len(running)}/{facts.nodes} workers running"),
            stalled=stalled,
            progressing=progressing,
        )

    waiting = [p for p in current_pods if p not in running and p not in finished]
    reason, message = waiting_reason(waiting, facts.nodes, len(running))
    if not current_pods:
        reason, message = "WaitingForPods", f"0/{facts.nodes} workers created"
    created = len([p for p in current_pods if not dig(p, "metadata", "deletionTimestamp")])
    if created < facts.nodes and _started_for(job, now) >= POD_CREATION_GRACE_SECONDS:
        # Pods the Job should have are missing: only the Job controller's Events say why. A pod
        # that cannot be created outranks how the created ones wait: without it the gang never runs.
        status.check_pod_creation = True
        if creation_refusal:
            reason = POD_CREATION_FAILED
            message = f"{created}/{facts.nodes} workers created; the Job controller cannot create the others: "
            message += creation_refusal
    return status.build(STARTING, message, (False, reason, message))


def _started_for(job: dict[str, Any], now: datetime) -> float:
    """Seconds since the Job controller started the Job (its status.startTime); 0 before."""
    started = parse_time(dig(job, "status", "startTime"))
    return (now - started).total_seconds() if started is not None else 0.0


def _queued(status: _StatusBuilder, job: dict[str, Any], queue: str, workload: dict[str, Any] | None) -> Assessment:
    """Waiting for Kueue, saying why (Kueue's words) and whether it queued again: after a gang
    restart (a new Job is a new Workload) or after Kueue evicted it."""
    reason, why = kueue_wait(workload)
    again = ""
    if status.start_time:
        last_failure = status.last_failure
        restarted = (
            reason != "Evicted"
            and last_failure is not None
            and last_failure.get("jobUid") != dig(job, "metadata", "uid")
        )
        again = " again after the gang restart" if restarted else " again"
    message = f"queued{again} in Kueue queue {queue}: {why}"
    if queue == NO_QUEUE_NAME:
        reason, message = "NoQueueName", f"{NO_QUEUE_NAME_MESSAGE}; {why}"
    return status.build(
        QUEUED, message, (False, "Queued", "waiting for Kueue to admit the job"), queued=(True, reason, message)
    )


def _after_failure(status: _StatusBuilder, job: dict[str, Any], failure: Failure) -> Assessment:
    """Failed for good (not retryable, or past maxRestarts), or restarting the gang; a failure of
    a Job uid already recorded is never counted twice."""
    facts = status.facts
    status.failure = failure
    job_uid = dig(job, "metadata", "uid")
    last_failure = status.last_failure
    already = last_failure is not None and last_failure.get("jobUid") == job_uid
    if not already:
        entry: dict[str, Any] = {
            "reason": failure.reason,
            "message": failure.message,
            "counted": failure.counted,
            "jobUid": job_uid,
            "time": format_time(status.now),
        }
        if failure.pod:
            entry["pod"] = failure.pod
        if failure.exit_code is not None:
            entry["exitCode"] = failure.exit_code
        status.last_failure = entry
    if not failure.retryable:
        status.action = Action.NONE
        status.completion_time = format_time(status.now)
        return status.build(
            FAILED, failure.message, (False, failure.reason, failure.message), failed_reason=failure.reason
        )
    if not already:
        if failure.counted and status.restarts >= facts.max_restarts:
            status.action = Action.NONE
            message = (
                f"the gang failed {status.restarts + 1} time(s), more than runPolicy.maxRestarts="
                f"{facts.max_restarts}; last failure {failure.reason}: {failure.message}"
            )
            status.completion_time = format_time(status.now)
            return status.build(
                FAILED, message, (False, failure.reason, failure.message), failed_reason="MaxRestartsExceeded"
            )
        if failure.counted:
            status.restarts += 1
        else:
            status.disruptions += 1
    status.action = Action.RESTART_GANG
    counted = "" if failure.counted else " (not counted against maxRestarts)"
    return status.build(
        RESTARTING,
        f"restarting the gang after {failure.reason}{counted}: {failure.message}",
        (False, failure.reason, failure.message),
    )


def _stall(
    facts: RunFacts, progress: dict[str, Any] | None, running_since: datetime, now: datetime
) -> tuple[bool, str, str]:
    if not facts.stall_timeout_seconds:
        return False, "NotStalled", "stall detection is off (runPolicy.stallTimeoutSeconds unset)"
    last = parse_time(dig(progress, "lastUpdateTime"))
    # A trainer that never reported counts from when the gang started running.
    reference = max(last, running_since) if last else running_since
    idle = (now - reference).total_seconds()
    if idle >= facts.stall_timeout_seconds:
        step = dig(progress, "step")
        at = f" at step {step}" if step is not None else ""
        return (
            True,
            "Stalled",
            (
                f"no training progress{at} for {int(idle)}s "
                f"(runPolicy.stallTimeoutSeconds={facts.stall_timeout_seconds})"
            ),
        )
    return False, "NotStalled", "training is progressing"


def _progressing(
    facts: RunFacts,
    progress: dict[str, Any] | None,
    step_since: datetime | None,
    step_moved: bool,
    running_since: datetime,
    now: datetime,
) -> ConditionState | None:
    """The Progressing condition of a running gang (None with the progress deadline off): False once
    its step has not advanced for runPolicy.progressDeadlineSeconds. Until this gang's trainer has
    reported, it is the gang's first step, allowed FIRST_STEP_ALLOWANCE_SECONDS more, counted from
    the start. A step this operator saw but not saw moving (it started since) counts from when it
    first saw it, the trainer's own report time telling whether this gang reached it. The messages
    of True stay the same while it holds (no status write per reconcile)."""
    deadline = facts.progress_deadline_seconds
    if not deadline:
        return None
    reported = parse_time(dig(progress, "lastUpdateTime"))
    if step_since is None:
        first, reference = True, running_since
    elif step_moved:
        first = step_since <= running_since
        reference = running_since if first else step_since
    else:
        first = reported is None or reported < running_since
        reference = max(step_since, running_since)
    allowed = deadline + (FIRST_STEP_ALLOWANCE_SECONDS if first else 0)
    idle = (now - reference).total_seconds()
    setting = f"runPolicy.progressDeadlineSeconds={deadline}"
    if idle < allowed:
        if first:
            message = (
                f"waiting for the gang's first training step ({setting}, plus "
                f"{FIRST_STEP_ALLOWANCE_SECONDS} s for the first step)"
            )
            return True, "WaitingForFirstStep", message
        return True, "StepAdvancing", f"the training step advances within {setting}"
    step = dig(progress, "step")
    where = "the gang's first training step" if first else f"training step {step}"
    return False, PROGRESS_DEADLINE_EXCEEDED, f"no progress past {where} for {int(idle)} s ({setting})"


def remaining_deadline(facts: RunFacts, record: Record, now: datetime) -> int | None:
    """activeDeadlineSeconds for a (re)created Job: what is left of the job's whole budget.

    A gang restart must not reset the user's deadline, so it counts from when the first gang
    started (the record's startTime). Returns None without a deadline, 0 when it has passed.
    """
    if not facts.active_deadline_seconds:
        return None
    started = parse_time(record.start_time)
    if started is None:
        return facts.active_deadline_seconds
    left = facts.active_deadline_seconds - int((now - started).total_seconds())
    return max(left, 0)
