"""No job missed: a namespace that appears inside kopf's namespace-observer window is served.

kopf lists the namespaces, then its watch lists them again and drops that listing's events, so
a namespace created in between is never served by kopf alone (kopf_glue/namespaces.py,
docs/decisions.md). The operator here runs under support/namespace_window.py, which holds that
window open until the test has created its namespace and job: the race happens every run.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from support.namespace_window import WINDOW_ENV
from support.operator_harness import OperatorProcess, tiny_job, wait_for, wait_phase

pytestmark = pytest.mark.cluster


def test_a_namespace_created_inside_the_observer_window_is_served(cluster, kube_cluster, crd_installed, tmp_path):
    window = tmp_path / "namespace-window"
    pattern = f"race-{uuid.uuid4().hex[:6]}"
    own = OperatorProcess(
        Path(kube_cluster.kubeconfig),
        [f"{pattern}-*"],
        tmp_path / "operator.log",
        runner=("support.namespace_window",),
        env={WINDOW_ENV: str(window)},
    )
    namespace = None
    try:
        own.start()
        wait_for(window.with_suffix(".open").exists, 30, "kopf's first namespace listing", on_timeout=own.log_tail)
        namespace = kube_cluster.new_namespace(f"{pattern}-late")  # after the first listing...
        cluster.create_job(namespace, tiny_job("late"))
        window.with_suffix(".close").touch()  # ...and before the watch's own listing
        wait_phase(cluster, namespace, "late", "Running", timeout=30, operator=own)
    finally:
        own.stop()
        if namespace:
            kube_cluster.delete_namespace(namespace)
