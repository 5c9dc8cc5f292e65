"""The gang's pods as the status shows them: how many workers run, and why the others wait."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from colocgrpo_operator.controller.objects import (
    as_list,
    container_statuses,
    dig,
    parse_time,
    pod_condition,
    truncate,
)

# Container waiting reasons that mean "this pod will not start by itself", worst first.
_IMAGE_PULL_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"})
_CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


def waiting_reason(pods: list[dict[str, Any]], nodes: int, running: int) -> tuple[str, str]:
    """The most telling reason the gang is not all running yet, with a message."""
    ranked: list[tuple[int, str, str]] = []
    for pod in pods:
        name = dig(pod, "metadata", "name")
        scheduled = pod_condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            ranked.append((0, "Unschedulable", f"pod {name}: {scheduled.get('message') or 'no node fits'}"))
            continue
        for status in container_statuses(pod):
            waiting = dig(status, "state", "waiting")
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
        return reason, truncate(message)
    return "WaitingForPods", f"{running}/{nodes} workers running"


def is_ready(pod: dict[str, Any]) -> bool:
    ready = pod_condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True")


def is_fully_running(pod: dict[str, Any]) -> bool:
    if dig(pod, "status", "phase") != "Running" or dig(pod, "metadata", "deletionTimestamp"):
        return False
    statuses = [s for s in as_list(dig(pod, "status", "containerStatuses")) if isinstance(s, dict)]
    return all(isinstance(dig(s, "state", "running"), dict) for s in statuses)


def has_exited_cleanly(pod: dict[str, Any]) -> bool:
    """Succeeded, or still reported Running by a kubelet that has seen every container exit 0: between
    the container's exit and the pod's phase update a real kubelet takes a moment, during which the
    pod is a finished rank, not one starting."""
    phase = dig(pod, "status", "phase")
    if phase == "Succeeded":
        return True
    if phase != "Running" or dig(pod, "metadata", "deletionTimestamp"):
        return False
    statuses = [s for s in as_list(dig(pod, "status", "containerStatuses")) if isinstance(s, dict)]
    return bool(statuses) and all(dig(s, "state", "terminated", "exitCode") == 0 for s in statuses)


def workers_of(pods: list[dict[str, Any]], gpus_per_node: int) -> dict[str, int]:
    active = [
        p
        for p in pods
        if dig(p, "status", "phase") in ("Pending", "Running") and not dig(p, "metadata", "deletionTimestamp")
    ]
    return {
        "active": len(active),
        "ready": sum(1 for p in active if is_ready(p)),
        "succeeded": sum(1 for p in pods if dig(p, "status", "phase") == "Succeeded"),
        "failed": sum(1 for p in pods if dig(p, "status", "phase") == "Failed"),
        "gpus": len([p for p in active if dig(p, "spec", "nodeName")]) * max(gpus_per_node, 0),
    }


# The Job controller's Event reason when the API server refuses one of its pods (PodSecurity
# admission, a ResourceQuota or LimitRange, a missing ServiceAccount, a webhook).
FAILED_CREATE = "FailedCreate"
# What the Event recorder puts before a message it aggregated from similar Events.
_COMBINED = "(combined from similar events): "


def _event_time(event: dict[str, Any]) -> datetime:
    """When an Event (core/v1, as the Job controller's recorder writes it) last happened."""
    for moment in (
        dig(event, "series", "lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        dig(event, "metadata", "creationTimestamp"),
    ):
        parsed = parse_time(moment)
        if parsed is not None:
            return parsed
    return datetime.min.replace(tzinfo=UTC)


def creation_refusal(events: list[dict[str, Any]], job_uid: str | None) -> str | None:
    """The message of the newest FailedCreate Event about the Job `job_uid` (why the Job
    controller could not create a pod, in the API server's words), or None without one."""
    refusals = [
        event
        for event in events
        if isinstance(event, dict)
        and event.get("reason") == FAILED_CREATE
        and job_uid is not None
        and dig(event, "involvedObject", "uid") == job_uid
        and isinstance(event.get("message"), str)
        and event["message"].strip()
    ]
    if not refusals:
        return None
    message = str(max(refusals, key=_event_time)["message"]).strip()
    return truncate(message.removeprefix(_COMBINED))
