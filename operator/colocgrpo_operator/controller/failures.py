"""Why a gang failed, from its batch Job and pods: the reason the status names and whether a
restart may fix it.

The first pod to die is the cause; the trainer names its own reason in its termination
message (JSON), and processes that died before they could are recognised by known text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from colocgrpo_operator.controller.objects import (
    container_statuses,
    dig,
    job_condition,
    pod_condition,
    truncate,
)

# Failure reasons a restart cannot fix: the same spec would fail the same way again.
NON_RETRYABLE_REASONS = frozenset({"DeadlineExceeded", "InvalidConfig", "DataError", "InvalidSpec"})

# What the trainer may report in its termination message (docs/trainer.md, failure reporting). A reward function's
# exception (RewardFunctionError, the user's code) is retried: a judge or API it calls may fail for a while.
TRAINER_REASONS = frozenset(
    {"CUDAOutOfMemory", "NCCLTimeout", "VLLMError", "InvalidConfig", "DataError", "RewardFunctionError", "TrainerError"}
)

# 128 + SIGTERM: the code a trainer pod exits with after a SIGTERM it did not ask for, once every rank has saved
# the agreed checkpoint (the trainer's reason "Terminated"; docs/trainer.md).
EXIT_SIGTERM = 143

# Plain-text recognition for processes that died before the trainer could write JSON
# (a CUDA OOM inside a NCCL call, a watchdog abort, a user's --command).
_TEXT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.I), "CUDAOutOfMemory"),
    (
        re.compile(r"NCCL.*(timed? ?out|timeout)|Watchdog caught collective operation timeout", re.I | re.S),
        "NCCLTimeout",
    ),
)


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
    condition = pod_condition(pod, "DisruptionTarget")
    if not condition or condition.get("status") != "True":
        return None
    cause = str(condition.get("reason") or "")
    reason = "Preempted" if "Preemption" in cause else "Evicted"
    message = condition.get("message") or dig(pod, "status", "message") or f"pod disrupted ({cause or 'unknown'})"
    return Failure(
        reason,
        truncate(f"pod {dig(pod, 'metadata', 'name')}: {message}"),
        counted=False,
        pod=dig(pod, "metadata", "name"),
        exit_code=_exit_code(pod),
    )


def _exit_code(pod: dict[str, Any]) -> int | None:
    """The exit code of the pod's first container that ended, if one did (143 where the trainer stopped at a
    checkpoint on the SIGTERM of a disruption)."""
    for status in container_statuses(pod):
        code = dig(status, "state", "terminated", "exitCode")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    return None


def _pod_failure(pod: dict[str, Any]) -> Failure:
    name = dig(pod, "metadata", "name")
    disruption = _disruption(pod)
    if disruption:
        return disruption
    if dig(pod, "status", "reason") == "Evicted":
        # Older kubelets evict without the DisruptionTarget condition.
        return Failure(
            "Evicted",
            truncate(f"pod {name}: {dig(pod, 'status', 'message', default='evicted')}"),
            counted=False,
            pod=name,
        )
    for status in container_statuses(pod):
        terminated = dig(status, "state", "terminated") or dig(status, "lastState", "terminated")
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
        stopped = exit_code == EXIT_SIGTERM and reason in (None, "Terminated")
        if stopped and not dig(pod, "metadata", "deletionTimestamp"):
            # Stopped from outside without being deleted (a preemption or node shutdown the kubelet marked no
            # disruption for): the gang resumes from its checkpoint, and a restart it did not cause is not
            # counted. A pod deleted by someone is the Job's failure, as before.
            return Failure(
                "Preempted",
                truncate(f"pod {name}: stopped by SIGTERM: {detail} (exit code {exit_code})"),
                counted=False,
                pod=name,
                exit_code=exit_code,
            )
        return Failure(
            reason or "Error",
            truncate(f"pod {name}: {detail} (exit code {exit_code})"),
            pod=name,
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )
    return Failure(
        "Error", truncate(f"pod {name} failed: {dig(pod, 'status', 'message', default='no details')}"), pod=name
    )


def _failure_time(pod: dict[str, Any]) -> str:
    """When the pod died: its containers' finish, or when it was marked disrupted or deleted."""
    times = []
    for status in container_statuses(pod):
        finished = dig(status, "state", "terminated", "finishedAt")
        if isinstance(finished, str):
            times.append(finished)
    disruption = pod_condition(pod, "DisruptionTarget")
    if disruption and isinstance(disruption.get("lastTransitionTime"), str):
        times.append(disruption["lastTransitionTime"])
    deleted = dig(pod, "metadata", "deletionTimestamp")
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
    if dig(job, "spec", "suspend") is True:
        return None  # pods of a suspended Job are deleted on purpose
    failed_pods = [p for p in pods if dig(p, "status", "phase") == "Failed"]
    job_failed = job_condition(job, "Failed") or job_condition(job, "FailureTarget")
    if job_failed and job_failed.get("reason") == "DeadlineExceeded":
        return Failure(
            "DeadlineExceeded", truncate(job_failed.get("message") or "the job ran past activeDeadlineSeconds")
        )
    evidence = [p for p in failed_pods if not dig(p, "metadata", "deletionTimestamp")]
    if job_failed and not failed_pods:
        return Failure(
            str(job_failed.get("reason") or "Error"), truncate(job_failed.get("message") or "the batch Job failed")
        )
    candidates = failed_pods if job_failed else evidence
    if not candidates:
        return None
    first = min(candidates, key=lambda p: (_failure_time(p), _disruption(p) is None, str(dig(p, "metadata", "name"))))
    return _pod_failure(first)
