"""Harness for operator tests against the real local control plane (fixtures: conftest.py).

The operator runs as a real subprocess (`python -m colocgrpo_operator.cli operator`), the way
the chart runs it, watching only namespaces named `opt-*`; each test gets a fresh `opt-...`
namespace. Tests assert on the objects the operator produces, never on its log text.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.cluster.commands import OPERATOR_COMMAND
from colocgrpo_dev.cluster.diagnose import health, pod_lines
from colocgrpo_dev.operator_process import OperatorProcess as DevOperatorProcess

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"
NAMESPACE_PATTERN = "opt-*"


class OperatorProcess(DevOperatorProcess):
    """The tests' operator: this checkout's, with tests/ on its path (a test may wrap it:
    support/namespace_window.py) and a 2 s re-check unless a test asks otherwise."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        log_path: Path,
        recheck_seconds: float = 2,
        extra_args: tuple[str, ...] = (),
        runner: tuple[str, ...] = OPERATOR_COMMAND,
        env: dict[str, str] | None = None,
    ):
        super().__init__(
            kubeconfig,
            namespaces,
            log_path,
            checkout=REPO,
            recheck_seconds=recheck_seconds,
            extra_args=extra_args,
            runner=runner,
            extra_paths=(REPO / "tests",),
            env=env,
        )

    def start(self, timeout: float = 60) -> None:
        super().start(timeout)

    def gang_restarts(self) -> float:
        """colocgrpo_gang_restarts_total, both labels together, as the metrics endpoint says now."""
        from support.promql import scraped_samples

        return sum(v for name, _, v in scraped_samples(self.metrics()) if name == "colocgrpo_gang_restarts_total")


class Cluster:
    """Raw-dict access to the objects the tests look at (the operator's own client class)."""

    def __init__(self, handle: Any, kubeconfig: Path | None = None):
        from colocgrpo_operator.kube.client import KubeApi

        self.handle = handle
        self.api = KubeApi.from_kubeconfig(str(kubeconfig or handle.kubeconfig), field_manager="colocgrpo-tests")

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        body.setdefault("metadata", {})["namespace"] = namespace
        return self.api.request("POST", f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs", body=body)

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        from colocgrpo_operator.kube.client import KubeApiError

        try:
            return self.api.request("GET", f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs/{name}")
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def patch_job(
        self, namespace: str, name: str, patch: dict[str, Any], subresource: str = "", dry_run: bool = False
    ) -> dict[str, Any]:
        path = f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs/{name}"
        if subresource:
            path += f"/{subresource}"
        query = {"dryRun": "All"} if dry_run else None
        return self.api.request("PATCH", path, body=patch, query=query, content_type="application/merge-patch+json")

    def delete_job(self, namespace: str, name: str) -> None:
        self.api.request("DELETE", f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs/{name}")

    def list(self, prefix: str, plural: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": selector} if selector else None
        return (self.api.request("GET", f"{prefix}/namespaces/{namespace}/{plural}", query=query) or {}).get(
            "items", []
        )

    def batch_jobs(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list("/apis/batch/v1", "jobs", namespace, f"colocgrpo.io/job-name={job}")

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self.list("/api/v1", "pods", namespace, f"colocgrpo.io/job-name={job}")

    def patch_batch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.request(
            "PATCH",
            f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            body=patch,
            content_type="application/merge-patch+json",
        )

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return self.list("/api/v1", "events", namespace)

    def as_service_account(self, namespace: str, account: str, folder: Path) -> Cluster:
        """The same access, with the token a pod running as that ServiceAccount would hold: one
        issued by the TokenRequest API (`kubectl create token`), in a kubeconfig of its own."""
        token = self.handle.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
        config = yaml.safe_load(Path(self.handle.kubeconfig).read_text())
        config["users"] = [{"name": account, "user": {"token": token}}]
        config["contexts"] = [{"name": account, "context": {"cluster": config["clusters"][0]["name"], "user": account}}]
        config["current-context"] = account
        path = folder / f"{namespace}-{account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return Cluster(self.handle, kubeconfig=path)


def report_progress(trainer: Cluster, namespace: str, name: str, job_uid: str | None, step: int) -> None:
    """Report `step` as the job's trainer does (`JobRef.progress_patch`, bound to `job_uid`), with
    the trainer's own token (`Cluster.as_service_account`). Raises KubeApiError when refused."""
    from colocgrpo_training.config import JobRef

    progress = {"step": step, "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    body, content_type = JobRef(name=name, namespace=namespace, uid=job_uid).progress_patch(progress)
    path = f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs/{name}/status"
    trainer.api.request("PATCH", path, body=body, content_type=content_type)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.25,
    on_timeout: Callable[[], str] | None = None,
) -> Any:
    """Poll until predicate() is truthy (returns it) or fail with what was last seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    detail = on_timeout() if on_timeout else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}\n{session_state()}\n{detail}")


# What every timeout reports first: the session's operator and control plane (conftest.py registers them).
_SESSION_PROBES: dict[str, Callable[[], str]] = {}


def add_session_probe(name: str, probe: Callable[[], str] | None) -> None:
    """Register (or with None, drop) a one-paragraph report `wait_for` puts at the top of every timeout's message,
    ahead of the test's own detail: a CI log that keeps only part of a failure still says whether the operator
    ran and the control plane's processes lived."""
    if probe is None:
        _SESSION_PROBES.pop(name, None)
    else:
        _SESSION_PROBES[name] = probe


def session_state() -> str:
    """Every registered probe's report; one that raises says so instead."""
    reports = []
    for name, probe in list(_SESSION_PROBES.items()):
        try:
            reports.append(probe())
        except Exception as error:  # a report must never hide the timeout it explains
            reports.append(f"{name}: report failed: {error!r}")
    return "\n".join(reports)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return item
    return {}


def tiny_job(name: str, **spec_overrides: Any) -> dict[str, Any]:
    """examples/tiny-cpu.yaml under a new name, with spec sections overridden (merged one level)."""
    body = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name}
    for section, value in spec_overrides.items():
        if isinstance(value, dict) and isinstance(body["spec"].get(section), dict):
            body["spec"][section] = {**body["spec"][section], **value}
        else:
            body["spec"][section] = value
    return body


def phase(cluster: Cluster, namespace: str, name: str) -> Any:
    return ((cluster.get_job(namespace, name) or {}).get("status") or {}).get("phase")


def wait_phase(
    cluster: Cluster,
    namespace: str,
    name: str,
    wanted: str | set[str],
    timeout: float = 30,
    operator: OperatorProcess | None = None,
) -> dict[str, Any]:
    """The job once its status.phase is (one of) `wanted`."""
    phases = {wanted} if isinstance(wanted, str) else set(wanted)
    return wait_for(
        lambda: (obj := cluster.get_job(namespace, name)) and (obj.get("status") or {}).get("phase") in phases and obj,
        timeout,
        f"{namespace}/{name} phase in {sorted(phases)}",
        on_timeout=lambda: (
            f"{pod_lines(cluster.handle.kubeconfig, namespace)}\n{health(cluster.handle.kubeconfig)}\n"
            f"status: {(cluster.get_job(namespace, name) or {}).get('status')}\n"
            + gang_state(cluster, namespace, name)
            + (operator.log_tail() if operator else "")
        ),
    )


def wait_event(cluster: Cluster, namespace: str, reason: str, naming: str, timeout: float) -> None:
    """Until the namespace holds an Event of that reason whose message names `naming`."""
    wait_for(
        lambda: any(
            e.get("reason") == reason and naming in (e.get("message") or "") for e in cluster.events(namespace)
        ),
        timeout,
        f"a {reason} Event naming {naming}",
        on_timeout=lambda: str(cluster.events(namespace)),
    )


def trainer_config_text(cluster: Cluster, namespace: str, job: str) -> str:
    """The trainer config (grpo.yaml) in the job's ConfigMap, as text."""
    from colocgrpo_operator.api.naming import GRPO_CONFIG_KEY

    config_map = cluster.api.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{job}-config")
    return str(config_map["data"][GRPO_CONFIG_KEY])


def gang_state(cluster: Cluster, namespace: str, name: str) -> str:
    """What the control plane says of a job's gang, for a timeout's message: each batch Job's
    status, each pod's node, phase and conditions, and the namespace's Events."""
    lines = []
    for job in cluster.batch_jobs(namespace, name):
        lines.append(f"batch Job {job['metadata']['name']}: {job.get('status')}")
    for pod in cluster.pods(namespace, name):
        status = pod.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        lines.append(
            f"pod {pod['metadata']['name']}: node {pod['spec'].get('nodeName')}, phase {status.get('phase')}, "
            f"conditions {conditions}, deleting {bool(pod['metadata'].get('deletionTimestamp'))}"
        )
    for event in cluster.events(namespace)[-20:]:
        lines.append(
            f"event {event.get('involvedObject', {}).get('kind')}/{event.get('involvedObject', {}).get('name')}: "
            f"{event.get('reason')}: {event.get('message')}"
        )
    return "".join(f"{line}\n" for line in lines)


def running_pod(
    cluster: Cluster, namespace: str, job: str, index: int = 0, exclude_uid: str | None = None, timeout: float = 30
) -> dict[str, Any]:
    """A Running, not deleting pod of the job's gang with that completion index (not `exclude_uid`)."""

    def find() -> dict[str, Any] | None:
        for pod in cluster.pods(namespace, job):
            labels = pod["metadata"].get("labels") or {}
            if labels.get("batch.kubernetes.io/job-completion-index") != str(index):
                continue
            if pod["metadata"]["uid"] == exclude_uid or pod["metadata"].get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") == "Running":
                return pod
        return None

    return wait_for(find, timeout, f"a running pod of {job} index {index}")


def kueue_queues(namespace: str, cluster_queue: str, **cluster_queue_spec: object) -> list[dict]:
    """A ClusterQueue of 8 GPUs (CPU and memory enough for any test job) admitting only `namespace`,
    and its LocalQueue `gpu` there; `cluster_queue_spec` adds to the ClusterQueue's spec."""
    quota = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": 8},
    ]
    spec: dict = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {"coveredResources": [r["name"] for r in quota], "flavors": [{"name": "gpu", "resources": quota}]}
        ],
    }
    spec.update(cluster_queue_spec)
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": spec,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]
