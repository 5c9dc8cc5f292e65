"""The API server goes away mid-burst and comes back (a control-plane restart): every job still
reaches its phase, and the operator says so in WARNING lines, with no ERROR and no traceback."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import urllib3

from colocgrpo_dev.cluster.cluster import has_component, restart_component
from colocgrpo_operator.kube.client import KubeApiError
from support.operator_harness import OperatorProcess, phase, tiny_job, wait_for


def _api_ready(cluster, namespace: str) -> bool:
    """The API server answers, the ColocGRPOJob API included (served a moment after the core)."""
    try:
        cluster.api.request("GET", f"/apis/colocgrpo.io/v1alpha1/namespaces/{namespace}/colocgrpojobs")
    except (KubeApiError, urllib3.exceptions.HTTPError):  # refused, reset, 503 while it starts
        return False
    return True


def _quiet_log(own: OperatorProcess) -> str:
    """The operator's log, once it is known to hold no ERROR line and no traceback."""
    log = own.log_path.read_text(errors="replace")
    errors = [line for line in log.splitlines() if re.search(r"\b(ERROR|CRITICAL)\b", line)]
    assert errors == [], "\n".join(errors[:40])
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 : log.index("Traceback") + 3000]
    return log


@pytest.mark.slow
def test_api_server_restart_mid_burst_loses_no_job_and_logs_no_error(cluster, kube_cluster, crd_installed, tmp_path):
    kubeconfig = Path(kube_cluster.kubeconfig)
    if not has_component(kubeconfig, "kube-apiserver"):
        pytest.skip("restarting the API server needs a `colocgrpo-dev cluster` (COLOCGRPO_KUBECONFIG is another)")
    namespace = kube_cluster.new_namespace("outage")
    own = OperatorProcess(kubeconfig, [namespace], tmp_path / "operator.log")
    names = [f"burst-{i}" for i in range(12)]
    try:
        own.start()
        for name in names[:8]:
            cluster.create_job(namespace, tiny_job(name))
        # Mid-burst: some jobs have children, some not yet.
        wait_for(
            lambda: cluster.list("/api/v1", "serviceaccounts", namespace, "colocgrpo.io/job-name"),
            30,
            "the burst's first children",
            interval=0.05,
        )
        restart_component(kubeconfig, "kube-apiserver")
        wait_for(lambda: _api_ready(cluster, namespace), 120, "the API server back")
        for name in names[8:]:
            cluster.create_job(namespace, tiny_job(name))
        for name in names:
            wait_for(
                lambda name=name: phase(cluster, namespace, name) == "Running",
                240,
                f"{name} Running after the restart",
                on_timeout=own.log_tail,
            )
        assert own.alive()
    finally:
        own.stop()
        kube_cluster.delete_namespace(namespace)
    log = _quiet_log(own)
    # The outage was met (by the reconciles, kopf's watches or both) and said in WARNING lines.
    assert re.search(r"WARNING .*(on a transient API error|Request attempt #)", log), log[-5000:]


@pytest.mark.slow
def test_jobs_replaced_and_deleted_while_the_operator_could_not_watch_are_seen_as_they_are(
    cluster, kube_cluster, crd_installed, tmp_path
):
    """The operator is frozen across an API server restart, and meanwhile one job is deleted and
    created again under the same name and another is deleted. Its watches cannot resume (the
    restarted server has no history: 410 Gone) and kopf re-lists, which drops nothing: both
    deleted jobs stay in kopf's index. The live job of the reused name still gets its own status
    and gang, and the index audit drops the two deleted ones."""
    kubeconfig = Path(kube_cluster.kubeconfig)
    if not has_component(kubeconfig, "kube-apiserver"):
        pytest.skip("restarting the API server needs a `colocgrpo-dev cluster` (COLOCGRPO_KUBECONFIG is another)")
    namespace = kube_cluster.new_namespace("unseen")
    own = OperatorProcess(kubeconfig, [namespace], tmp_path / "operator.log")
    try:
        own.start()
        old = cluster.create_job(namespace, tiny_job("phoenix"))["metadata"]["uid"]
        gone = cluster.create_job(namespace, tiny_job("gone"))["metadata"]["uid"]
        for name in ("phoenix", "gone"):
            wait_for(lambda name=name: phase(cluster, namespace, name) == "Running", 60, f"{name} Running")
        os.kill(own.process.pid, signal.SIGSTOP)
        try:
            restart_component(kubeconfig, "kube-apiserver")
            wait_for(lambda: _api_ready(cluster, namespace), 120, "the API server back")
            for name in ("phoenix", "gone"):
                cluster.delete_job(namespace, name)
                wait_for(lambda name=name: cluster.get_job(namespace, name) is None, 30, f"{name} deleted")
            new = cluster.create_job(namespace, tiny_job("phoenix"))["metadata"]["uid"]
        finally:
            os.kill(own.process.pid, signal.SIGCONT)
        running = wait_for(
            lambda: (
                (job := cluster.get_job(namespace, "phoenix"))
                and (job.get("status") or {}).get("phase") == "Running"
                and job
            ),
            90,
            "the new phoenix Running",
            on_timeout=own.log_tail,
        )
        assert running["metadata"]["uid"] == new
        live = [j for j in cluster.batch_jobs(namespace, "phoenix") if not j["metadata"].get("deletionTimestamp")]
        assert [o["uid"] for j in live for o in j["metadata"]["ownerReferences"]] == [new], live
        wait_for(
            lambda: f"(uid {old})" in own.log_path.read_text() and f"(uid {gone})" in own.log_path.read_text(),
            60,
            "the index audit to drop both deleted jobs",
            on_timeout=own.log_tail,
        )
        assert own.alive()
    finally:
        own.stop()
        kube_cluster.delete_namespace(namespace)
    _quiet_log(own)
