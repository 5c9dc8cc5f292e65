"""Per-pod fake container logs: what `kubectl logs` (and our `colocgrpo logs`) shows for a KWOK pod.

Every pod prints the cluster-wide ClusterLogs lines unless a kwok `Logs` object names it; this
writes a CRI-format log file next to the cluster's state and points such an object at it.
With follow on, `kubectl logs -f` tails the file, so appending lines looks like a live process.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from colocgrpo_dev.cluster.kwokctl_config import FAKE_LOG_LINES


def _cri_lines(lines: Iterable[str], stream: str = "stdout") -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return "".join(f"{now} {stream} F {line}\n" for line in lines)


def set_fake_logs(
    api_client: Any,
    kubeconfig: Path,
    namespace: str,
    pod: str,
    lines: Iterable[str],
    container: str | None = None,
) -> Path:
    """Make `kubectl logs` of this pod (or one of its containers) print `lines`; return the file.

    The file lives in the cluster's state folder (next to its kubeconfig), so `down` removes it.
    """
    from kubernetes import client

    log_file = Path(kubeconfig).parent / "fake-logs" / namespace / f"{pod}.{container or 'all'}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(_cri_lines(lines))
    entry: dict[str, Any] = {"logsFile": str(log_file), "follow": True}
    entries = [entry]
    if container:
        entry["containers"] = [container]
        # A Logs object replaces ClusterLogs for the whole pod; the other containers keep
        # printing the cluster-wide lines through a default entry (one without containers).
        default_file = log_file.with_name(f"{pod}.all.log")
        if not default_file.exists():
            default_file.write_text(_cri_lines(FAKE_LOG_LINES))
        entries.append({"logsFile": str(default_file), "follow": True})
    body = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": entries},
    }
    custom = client.CustomObjectsApi(api_client)
    try:
        custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", namespace, "logs", body)
    except client.exceptions.ApiException as error:
        if error.status != 409:
            raise
        existing = cast(
            "dict[str, Any]",
            custom.get_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", namespace, "logs", pod),
        )
        # One Logs object per pod: keep the other entries, replace the one for these containers
        # (for container=None that is the default entry).
        kept = [e for e in existing["spec"]["logs"] if e.get("containers") != entry.get("containers")]
        existing["spec"]["logs"] = [*kept, entry]
        custom.replace_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", namespace, "logs", pod, existing)
    return log_file


def append_fake_logs(log_file: Path, lines: Iterable[str]) -> None:
    """Add lines to a fake log (seen by `kubectl logs -f` followers)."""
    with open(log_file, "a") as handle:
        handle.write(_cri_lines(lines))
