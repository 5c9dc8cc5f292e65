"""What is really happening to a ColocGRPOJob, derived from the objects Kubernetes shows.

Everything here is pure: (the job's run facts, its batch/v1 Job, the Job's pods, the previous
status, now) in, (the new status, the one action the operator must take) out. The kopf
handlers only gather the inputs from their indices and carry out the action, so every
decision about phases, reasons and restarts is unit-tested without a cluster.

The status written here never contains `progress`: that subtree belongs to the trainer.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from datetime import UTC, datetime
from typing import Any

from colocgrpo_operator.api import ConditionType, Phase
from colocgrpo_operator.api.naming import COMPLETION_INDEX_KEY

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

# Condition types, in the order they are listed in status.conditions (the API enum's order).
CONDITION_TYPES = tuple(condition_type.value for condition_type in ConditionType)

# Failure reasons a restart cannot fix: the same spec would fail the same way again.
NON_RETRYABLE_REASONS = frozenset({"DeadlineExceeded", "InvalidConfig", "DataError", "InvalidSpec"})

# What the trainer may report in its termination message (shared/DESIGN.md failure reporting).
TRAINER_REASONS = frozenset(
    {"CUDAOutOfMemory", "NCCLTimeout", "VLLMError", "InvalidConfig", "DataError", "TrainerError"}
)

# Plain-text recognition for processes that died before the trainer could write JSON
# (a CUDA OOM inside a NCCL call, a watchdog abort, a user's --command).
_TEXT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.I), "CUDAOutOfMemory"),
    (
        re.compile(r"NCCL.*(timed? ?out|timeout)|Watchdog caught collective operation timeout", re.I | re.S),
        "NCCLTimeout",
    ),
)

# Container waiting reasons that mean "this pod will not start by itself", worst first.
_IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})
_CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})

_MAX_MESSAGE = 2000


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes timestamps."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A Kubernetes timestamp (or None for anything unparseable: status is never trusted blindly)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


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


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why the gang stopped. `counted` is False for evictions and preemptions."""

    reason: str
    message: str
    counted: bool = True
    pod: str | None = None
    exit_code: int | None = None

    @property
    def retryable(self) -> bool:
        return self.reason not in NON_RETRYABLE_REASONS


class Action(enum.StrEnum):
    NONE = "None"
    CREATE_JOB = "CreateJob"  # no batch Job exists and one should
    RESTART_GANG = "RestartGang"  # delete the failed Job (its pods go with it); recreated once gone
    SUSPEND_JOB = "SuspendJob"  # set the Job's spec.suspend to true
    RESUME_JOB = "ResumeJob"  # set it to false (never when Kueue manages admission)


@dataclasses.dataclass(frozen=True)
class Assessment:
    status: dict[str, Any]
    action: Action = Action.NONE
    failure: Failure | None = None

    @property
    def phase(self) -> str:
        return self.status["phase"]


# ----------------------------------------------------------------------------- small readers


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return default
        obj = obj.get(key)
    return default if obj is None else obj


def _list(value: Any) -> list[Any]:
    """The value if it is a list (status written by others is never trusted to be well-formed)."""
    return value if isinstance(value, list) else []


def _job_condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in _list(_get(job, "status", "conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def _pod_condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in _list(_get(pod, "status", "conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    statuses = _list(_get(pod, "status", "initContainerStatuses")) + _list(_get(pod, "status", "containerStatuses"))
    return [s for s in statuses if isinstance(s, dict)]


def _truncate(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def pods_of_job(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of this very Job (by owner uid): pods of a deleted predecessor do not count."""
    uid = _get(job, "metadata", "uid")
    if not uid:
        return []
    owned = []
    for pod in pods:
        owners = _list(_get(pod, "metadata", "ownerReferences"))
        if any(isinstance(o, dict) and o.get("uid") == uid for o in owners):
            owned.append(pod)
    return owned


def completion_index(pod: dict[str, Any]) -> int | None:
    value = _get(pod, "metadata", "labels", COMPLETION_INDEX_KEY)
    if value is None:
        value = _get(pod, "metadata", "annotations", COMPLETION_INDEX_KEY)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------- failures


def reason_from_termination_message(message: str) -> tuple[str | None, str]:
    """(reason, human message) from a container's termination message.

    The trainer writes JSON {"reason": ..., "message": ...}; anything else is matched
    against known plain-text signatures. Unknown reasons are kept if they look like a
    CamelCase identifier (so a newer trainer's reason is shown, not hidden).
    """
    text = (message or "").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            reason = data.get("reason")
            human = data.get("message")
            human = human if isinstance(human, str) else text
            if isinstance(reason, str) and re.fullmatch(r"[A-Z][A-Za-z0-9]{0,63}", reason):
                return reason, human
            return _reason_from_text(human), human
    return _reason_from_text(text), text


def _reason_from_text(text: str) -> str | None:
    for pattern, reason in _TEXT_PATTERNS:
        if pattern.search(text):
            return reason
    return None


def _disruption(pod: dict[str, Any]) -> Failure | None:
    condition = _pod_condition(pod, "DisruptionTarget")
    if not condition or condition.get("status") != "True":
        return None
    cause = str(condition.get("reason") or "")
    reason = "Preempted" if "Preemption" in cause else "Evicted"
    message = condition.get("message") or _get(pod, "status", "message") or f"pod disrupted ({cause or 'unknown'})"
    return Failure(
        reason,
        _truncate(f"pod {_get(pod, 'metadata', 'name')}: {message}"),
        counted=False,
        pod=_get(pod, "metadata", "name"),
    )


def _pod_failure(pod: dict[str, Any]) -> Failure:
    name = _get(pod, "metadata", "name")
    disruption = _disruption(pod)
    if disruption:
        return disruption
    if _get(pod, "status", "reason") == "Evicted":
        # Older kubelets evict without the DisruptionTarget condition.
        return Failure(
            "Evicted",
            _truncate(f"pod {name}: {_get(pod, 'status', 'message', default='evicted')}"),
            counted=False,
            pod=name,
        )
    for status in _container_statuses(pod):
        terminated = _get(status, "state", "terminated") or _get(status, "lastState", "terminated")
        if not isinstance(terminated, dict):
            continue
        exit_code = terminated.get("exitCode")
        if exit_code == 0:
            continue
        container = status.get("name", "trainer")
        if terminated.get("reason") == "OOMKilled":
            return Failure(
                "OOMKilled",
                f"pod {name}: container {container} was killed for exceeding its memory limit",
                pod=name,
                exit_code=exit_code,
            )
        reason, human = reason_from_termination_message(str(terminated.get("message") or ""))
        detail = human or f"container {container} exited with code {exit_code}"
        return Failure(
            reason or "Error",
            _truncate(f"pod {name}: {detail} (exit code {exit_code})"),
            pod=name,
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )
    return Failure(
        "Error", _truncate(f"pod {name} failed: {_get(pod, 'status', 'message', default='no details')}"), pod=name
    )


def _failure_time(pod: dict[str, Any]) -> str:
    """When the pod died: its containers' finish, or when it was marked disrupted or deleted."""
    times = []
    for status in _container_statuses(pod):
        finished = _get(status, "state", "terminated", "finishedAt")
        if isinstance(finished, str):
            times.append(finished)
    disruption = _pod_condition(pod, "DisruptionTarget")
    if disruption and isinstance(disruption.get("lastTransitionTime"), str):
        times.append(disruption["lastTransitionTime"])
    deleted = _get(pod, "metadata", "deletionTimestamp")
    if isinstance(deleted, str):
        times.append(deleted)
    return min(times) if times else "~"  # "~" sorts after digits: pods without times go last


def classify_failure(job: dict[str, Any], pods: list[dict[str, Any]]) -> Failure | None:
    """Why the current gang failed, or None while it has not.

    The gang has failed when the Job says so (Failed or FailureTarget) or one of its pods
    failed on its own: one dead rank stalls every collective, so the whole gang restarts. A
    pod that failed because it was deleted (suspension, a scale-down, namespace teardown) is
    not evidence by itself; only the Job's own verdict makes it one. The first pod to die is
    the cause — the others usually die of it (NCCL timeouts, or the Job controller deleting
    them) — and a cause that was evicted or preempted makes the failure uncounted.
    """
    if _get(job, "spec", "suspend") is True:
        return None  # pods of a suspended Job are deleted on purpose
    failed_pods = [p for p in pods if _get(p, "status", "phase") == "Failed"]
    job_failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    if job_failed and job_failed.get("reason") == "DeadlineExceeded":
        return Failure(
            "DeadlineExceeded", _truncate(job_failed.get("message") or "the job ran past activeDeadlineSeconds")
        )
    evidence = [p for p in failed_pods if not _get(p, "metadata", "deletionTimestamp")]
    if not evidence and not job_failed:
        return None
    candidates = failed_pods if job_failed else evidence
    if candidates:
        first = min(
            candidates, key=lambda p: (_failure_time(p), _disruption(p) is None, str(_get(p, "metadata", "name")))
        )
        return _pod_failure(first)
    return Failure(
        str(job_failed.get("reason") or "Error"), _truncate(job_failed.get("message") or "the batch Job failed")
    )


# ----------------------------------------------------------------------------- waiting pods


def _waiting_reason(pods: list[dict[str, Any]], nodes: int, running: int) -> tuple[str, str]:
    """The most telling reason the gang is not all running yet, with a message."""
    ranked: list[tuple[int, str, str]] = []
    for pod in pods:
        name = _get(pod, "metadata", "name")
        scheduled = _pod_condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            ranked.append((0, "Unschedulable", f"pod {name}: {scheduled.get('message') or 'no node fits'}"))
            continue
        for status in _container_statuses(pod):
            waiting = _get(status, "state", "waiting")
            if not isinstance(waiting, dict):
                continue
            reason = str(waiting.get("reason") or "")
            message = waiting.get("message") or reason
            if reason in _IMAGE_PULL_REASONS:
                ranked.append((1, "ImagePullBackOff", f"pod {name}: {reason}: {message}"))
            elif reason == "CrashLoopBackOff":
                ranked.append((2, "CrashLoopBackOff", f"pod {name}: {message}"))
            elif reason in _CONFIG_REASONS:
                ranked.append((3, reason, f"pod {name}: {message}"))
            elif reason:
                ranked.append((5, "ContainerCreating", f"pod {name}: {reason}"))
    if ranked:
        _, reason, message = min(ranked)
        return reason, _truncate(message)
    return "WaitingForPods", f"{running}/{nodes} workers running"


def _is_ready(pod: dict[str, Any]) -> bool:
    ready = _pod_condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True")


def _is_fully_running(pod: dict[str, Any]) -> bool:
    if _get(pod, "status", "phase") != "Running" or _get(pod, "metadata", "deletionTimestamp"):
        return False
    statuses = [s for s in _list(_get(pod, "status", "containerStatuses")) if isinstance(s, dict)]
    return all(isinstance(_get(s, "state", "running"), dict) for s in statuses)


def workers_of(pods: list[dict[str, Any]], gpus_per_node: int) -> dict[str, int]:
    active = [
        p
        for p in pods
        if _get(p, "status", "phase") in ("Pending", "Running") and not _get(p, "metadata", "deletionTimestamp")
    ]
    return {
        "active": len(active),
        "ready": sum(1 for p in active if _is_ready(p)),
        "succeeded": sum(1 for p in pods if _get(p, "status", "phase") == "Succeeded"),
        "failed": sum(1 for p in pods if _get(p, "status", "phase") == "Failed"),
        "gpus": len([p for p in active if _get(p, "spec", "nodeName")]) * max(gpus_per_node, 0),
    }


# ----------------------------------------------------------------------------- conditions


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with one condition set; lastTransitionTime moves only when status flips."""
    status_text = status if isinstance(status, str) else ("True" if status else "False")
    previous = next((c for c in conditions if isinstance(c, dict) and c.get("type") == type_), None)
    if previous and previous.get("status") == status_text and previous.get("lastTransitionTime"):
        transition = previous["lastTransitionTime"]
    else:
        transition = format_time(now)
    condition = {
        "type": type_,
        "status": status_text,
        "reason": reason,
        "message": _truncate(message),
        "lastTransitionTime": transition,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == type_)]
    return _ordered([*others, condition])


def _ordered(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def rank(condition: dict[str, Any]) -> int:
        type_ = condition.get("type")
        return CONDITION_TYPES.index(type_) if type_ in CONDITION_TYPES else len(CONDITION_TYPES)

    return sorted((c for c in conditions if isinstance(c, dict)), key=rank)


def condition_of(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for condition in _list((status or {}).get("conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None


# ----------------------------------------------------------------------------- the derivation


def invalid_spec_status(
    previous: dict[str, Any] | None, problems: list[tuple[str, str]], now: datetime, generation: int | None
) -> dict[str, Any]:
    """Status of a job whose spec the operator refuses: Failed/InvalidSpec, naming each field."""
    message = "; ".join(f"{path}: {text}" for path, text in problems) or "the spec is invalid"
    base = _carry_over(previous)
    conditions = base.get("conditions", [])
    conditions = set_condition(conditions, "SpecValid", False, "InvalidSpec", message, now, generation)
    conditions = set_condition(
        conditions, "Running", False, "InvalidSpec", "no pods are created for an invalid spec", now, generation
    )
    conditions = set_condition(conditions, "Failed", True, "InvalidSpec", message, now, generation)
    # No pods exist for an invalid spec: zero workers, so `kubectl get cgj` shows GPUs 0, not blank.
    base.update(
        phase=FAILED,
        message=_truncate(f"invalid spec: {message}"),
        conditions=conditions,
        observedGeneration=generation,
        workers=workers_of([], 0),
    )
    return base


def _carry_over(previous: dict[str, Any] | None) -> dict[str, Any]:
    """The operator-owned part of the previous status (never `progress`)."""
    previous = dict(previous or {})
    previous.pop("progress", None)
    conditions = [c for c in previous.get("conditions") or [] if isinstance(c, dict)]
    previous["conditions"] = conditions
    return previous


def _as_int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def assess(
    facts: RunFacts,
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    now: datetime,
    progress: dict[str, Any] | None = None,
) -> Assessment:
    """Derive the status (without progress) and the operator's next action.

    `job` is the batch/v1 Job named after the ColocGRPOJob (None when absent), `pods` every
    pod labelled with the job's name (pods of older Jobs are filtered out here), `previous`
    the current status, `progress` the trainer's status.progress (for stall detection).
    """
    base = _carry_over(previous)
    prev_phase = base.get("phase")
    generation = facts.generation
    conditions = base["conditions"]
    conditions = set_condition(conditions, "SpecValid", True, "Valid", "the spec is valid", now, generation)
    restarts = _as_int(base.get("restarts"))
    disruptions = _as_int(base.get("disruptions"))
    last_failure = base.get("lastFailure") if isinstance(base.get("lastFailure"), dict) else None
    current_pods = pods_of_job(job, pods)
    workers = workers_of(current_pods, facts.gpus_per_node)
    rank0 = next(
        (p for p in current_pods if completion_index(p) == 0 and not _get(p, "metadata", "deletionTimestamp")), None
    )
    action = Action.NONE
    failure: Failure | None = None

    def finish(phase: str, message: str, running: tuple[bool, str, str], **extra: Any) -> Assessment:
        nonlocal conditions
        run_ok, run_reason, run_message = running
        conditions = set_condition(conditions, "Running", run_ok, run_reason, run_message, now, generation)
        queued = phase == QUEUED
        conditions = set_condition(
            conditions,
            "Queued",
            queued,
            "WaitingForAdmission" if queued else "NotQueued",
            f"waiting for Kueue queue {facts.queue_name} to admit the job" if queued else "not waiting for admission",
            now,
            generation,
        )
        suspended = phase == SUSPENDED
        conditions = set_condition(
            conditions,
            "Suspended",
            suspended,
            "SuspendedByUser" if suspended else "NotSuspended",
            "spec.runPolicy.suspend is true: the gang's pods are deleted" if suspended else "not suspended",
            now,
            generation,
        )
        conditions = set_condition(
            conditions,
            "Succeeded",
            phase == SUCCEEDED,
            "Completed" if phase == SUCCEEDED else "NotCompleted",
            message if phase == SUCCEEDED else "training has not completed",
            now,
            generation,
        )
        failed_reason = extra.pop("failed_reason", None)
        conditions = set_condition(
            conditions,
            "Failed",
            phase == FAILED,
            failed_reason or "NotFailed",
            message if phase == FAILED else "no fatal failure",
            now,
            generation,
        )
        stalled = extra.pop("stalled", None) or (False, "NotStalled", "the gang is not running")
        conditions = set_condition(conditions, "Stalled", stalled[0], stalled[1], stalled[2], now, generation)
        status = dict(base)
        status.update(
            phase=phase,
            message=_truncate(message),
            conditions=conditions,
            observedGeneration=generation,
            restarts=restarts,
            disruptions=disruptions,
            workers=workers,
        )
        status["rank0Pod"] = _get(rank0, "metadata", "name")
        if last_failure is not None:
            status["lastFailure"] = last_failure
        status.update(extra)
        for key in [k for k, v in status.items() if v is None]:
            del status[key]
        return Assessment(status, action, failure)

    # A finished job stays finished: its Job may be garbage-collected or its pods cleaned up.
    # (A job failed for an invalid spec is the exception: fixing the spec revives it.)
    spec_was_invalid = (condition_of(base, "SpecValid") or {}).get("reason") == "InvalidSpec"
    if prev_phase in TERMINAL_PHASES and not spec_was_invalid:
        return Assessment(dict(base, observedGeneration=generation), Action.NONE, None)

    if job is None or _get(job, "metadata", "deletionTimestamp"):
        if job is None:
            if remaining_deadline(facts, base, now) == 0:
                message = (
                    f"the job ran past runPolicy.activeDeadlineSeconds={facts.active_deadline_seconds} "
                    "before its gang could be recreated"
                )
                return finish(
                    FAILED,
                    message,
                    (False, "DeadlineExceeded", message),
                    failed_reason="DeadlineExceeded",
                    completionTime=format_time(now),
                )
            action = Action.CREATE_JOB
        if prev_phase == RESTARTING or (job is not None):
            message = (last_failure or {}).get("message") or "recreating the gang"
            return finish(
                RESTARTING,
                f"restarting the gang: {message}",
                (False, "Restarting", "the previous gang is being replaced"),
            )
        return finish(PENDING, "creating the gang", (False, "Pending", "the batch Job is being created"))

    # Propagate the user's suspend; with Kueue only ever towards suspension (Kueue owns resume).
    job_suspended = _get(job, "spec", "suspend") is True
    if facts.suspend and not job_suspended:
        action = Action.SUSPEND_JOB
    elif not facts.suspend and job_suspended and not facts.queue_name:
        action = Action.RESUME_JOB

    # When the gang first started: the Job's startTime, or now if its pods exist before the Job
    # controller got round to writing it (a busy controller-manager writes status late).
    start_time = base.get("startTime")
    if not start_time and not job_suspended and (_get(job, "status", "startTime") or current_pods):
        start_time = _get(job, "status", "startTime") or format_time(now)

    complete = _job_condition(job, "Complete") or _job_condition(job, "SuccessCriteriaMet")
    if complete and _job_condition(job, "Complete"):
        completion = _get(job, "status", "completionTime") or complete.get("lastTransitionTime") or format_time(now)
        return finish(
            SUCCEEDED,
            "training completed",
            (False, "Completed", "all workers completed"),
            startTime=start_time,
            completionTime=completion,
        )

    failure = classify_failure(job, current_pods)
    if failure is not None:
        job_uid = _get(job, "metadata", "uid")
        already = last_failure is not None and last_failure.get("jobUid") == job_uid
        if not already:
            last_failure = {
                "reason": failure.reason,
                "message": failure.message,
                "counted": failure.counted,
                "jobUid": job_uid,
                "time": format_time(now),
            }
            if failure.pod:
                last_failure["pod"] = failure.pod
            if failure.exit_code is not None:
                last_failure["exitCode"] = failure.exit_code
        if not failure.retryable:
            action = Action.NONE
            return finish(
                FAILED,
                failure.message,
                (False, failure.reason, failure.message),
                failed_reason=failure.reason,
                startTime=start_time,
                completionTime=format_time(now),
            )
        if not already:
            if failure.counted and restarts >= facts.max_restarts:
                action = Action.NONE
                message = (
                    f"the gang failed {restarts + 1} time(s), more than runPolicy.maxRestarts="
                    f"{facts.max_restarts}; last failure {failure.reason}: {failure.message}"
                )
                return finish(
                    FAILED,
                    message,
                    (False, failure.reason, failure.message),
                    failed_reason="MaxRestartsExceeded",
                    startTime=start_time,
                    completionTime=format_time(now),
                )
            if failure.counted:
                restarts += 1
            else:
                disruptions += 1
        action = Action.RESTART_GANG
        counted = "" if failure.counted else " (not counted against maxRestarts)"
        return finish(
            RESTARTING,
            f"restarting the gang after {failure.reason}{counted}: {failure.message}",
            (False, failure.reason, failure.message),
            startTime=start_time,
        )

    if job_suspended:
        if facts.suspend:
            return finish(
                SUSPENDED,
                "suspended by spec.runPolicy.suspend",
                (False, "Suspended", "the job is suspended"),
                startTime=start_time,
            )
        if facts.queue_name:
            return finish(
                QUEUED,
                f"waiting for Kueue queue {facts.queue_name} to admit the job",
                (False, "Queued", "waiting for admission"),
                startTime=start_time,
            )
        return finish(
            PENDING, "resuming the job", (False, "Resuming", "the batch Job is being resumed"), startTime=start_time
        )

    running = [p for p in current_pods if _is_fully_running(p)]
    finished = [p for p in current_pods if _get(p, "status", "phase") == "Succeeded"]
    if finished and len(running) + len(finished) >= facts.nodes:
        # Ranks exit one by one at the end; until the Job says Complete the gang is finishing.
        message = f"{len(finished)}/{facts.nodes} workers completed" + (
            "; the Job is completing" if len(finished) >= facts.nodes else "; the others are finishing"
        )
        return finish(RUNNING, message, (True, "Finishing", message), startTime=start_time)
    if len(running) >= facts.nodes:
        running_since = condition_of({"conditions": conditions}, "Running")
        since = (
            parse_time(running_since.get("lastTransitionTime"))
            if (running_since and running_since.get("status") == "True")
            else now
        )
        stalled = _stall(facts, progress, since or now, now)
        message = f"{len(running)}/{facts.nodes} workers running"
        if stalled[0]:
            message = f"{message}; {stalled[2]}"
        return finish(
            RUNNING,
            message,
            (True, "AllWorkersRunning", f"{len(running)}/{facts.nodes} workers running"),
            stalled=stalled,
            startTime=start_time,
        )

    waiting = [p for p in current_pods if p not in running and _get(p, "status", "phase") != "Succeeded"]
    reason, message = _waiting_reason(waiting, facts.nodes, len(running))
    if not current_pods:
        reason, message = "WaitingForPods", f"0/{facts.nodes} workers created"
    return finish(STARTING, message, (False, reason, message), startTime=start_time)


def _stall(
    facts: RunFacts, progress: dict[str, Any] | None, running_since: datetime, now: datetime
) -> tuple[bool, str, str]:
    if not facts.stall_timeout_seconds:
        return False, "NotStalled", "stall detection is off (runPolicy.stallTimeoutSeconds unset)"
    last = parse_time(_get(progress, "lastUpdateTime"))
    # A trainer that never reported counts from when the gang started running.
    reference = max(last, running_since) if last else running_since
    idle = (now - reference).total_seconds()
    if idle >= facts.stall_timeout_seconds:
        step = _get(progress, "step")
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


def remaining_deadline(facts: RunFacts, status: dict[str, Any] | None, now: datetime) -> int | None:
    """activeDeadlineSeconds for a (re)created Job: what is left of the job's whole budget.

    A gang restart must not reset the user's deadline, so it counts from status.startTime.
    Returns None without a deadline, 0 when it has already passed.
    """
    if not facts.active_deadline_seconds:
        return None
    started = parse_time((status or {}).get("startTime"))
    if started is None:
        return facts.active_deadline_seconds
    left = facts.active_deadline_seconds - int((now - started).total_seconds())
    return max(left, 0)
