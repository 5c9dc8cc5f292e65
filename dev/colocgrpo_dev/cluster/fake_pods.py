"""Drive fake (KWOK) pods on from Running, the way a real container would end.

KWOK runs no containers: its stages (cluster/kwok/pod-stages.yaml) keep a scheduled pod
Running until one of these helpers annotates it; the matching stage then writes the status a
kubelet would (terminated containers, phase, reason, conditions). Annotating, rather than
patching status here, keeps one writer of pod status (kwok) and works from `kubectl annotate`.
"""

from __future__ import annotations

import time
from typing import Any

EXIT_ANNOTATION = "colocgrpo.dev/fake-exit"
MESSAGE_ANNOTATION = "colocgrpo.dev/fake-message"


def _annotate(core_v1: Any, namespace: str, name: str, exit_value: str, message: str | None) -> None:
    annotations = {EXIT_ANNOTATION: exit_value}
    if message is not None:
        annotations[MESSAGE_ANNOTATION] = message
    core_v1.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


def drive_pod_success(core_v1: Any, namespace: str, name: str, message: str | None = None) -> None:
    """All containers exit 0; the pod becomes Succeeded."""
    _annotate(core_v1, namespace, name, "0", message)


def drive_pod_failure(
    core_v1: Any,
    namespace: str,
    name: str,
    exit_code: int = 1,
    message: str = "",
    reason: str = "Error",
) -> None:
    """All containers exit with `exit_code` and `message` as termination message; pod Failed.

    reason "Error" (any non-zero exit) or "OOMKilled" (exit code is then 137, as the kernel's
    SIGKILL gives).
    """
    if reason == "OOMKilled":
        _annotate(core_v1, namespace, name, "oom", message)
        return
    if reason != "Error":
        raise ValueError(f"reason must be 'Error' or 'OOMKilled', not {reason!r}")
    if int(exit_code) == 0:
        raise ValueError("a failure needs a non-zero exit code; use drive_pod_success")
    _annotate(core_v1, namespace, name, str(int(exit_code)), message)


def evict_pod(core_v1: Any, namespace: str, name: str, message: str | None = None) -> None:
    """A node-pressure eviction as the kubelet reports it: phase Failed, reason Evicted,
    condition DisruptionTarget=True (reason TerminationByKubelet). The pod object stays.

    For an API-initiated eviction (DisruptionTarget reason EvictionByEvictionAPI, pod deleted)
    use the real Eviction API: core_v1.create_namespaced_pod_eviction(...).
    """
    _annotate(core_v1, namespace, name, "evict", message)


def wait_for_pod_phase(core_v1: Any, namespace: str, name: str, phases: set[str] | str, timeout: float = 30) -> Any:
    """Poll until the pod's phase is one of `phases`; return the pod."""
    wanted = {phases} if isinstance(phases, str) else set(phases)
    deadline = time.monotonic() + timeout
    while True:
        pod = core_v1.read_namespaced_pod(name, namespace)
        if pod.status.phase in wanted:
            return pod
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name} is {pod.status.phase}, not in {sorted(wanted)}")
        time.sleep(0.2)
