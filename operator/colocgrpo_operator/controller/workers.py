"""The gang's pods as the status shows them: how many workers run, and why the others wait."""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.controller.objects import as_list, container_statuses, dig, pod_condition, truncate

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
