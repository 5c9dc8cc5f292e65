"""Fixtures for operator tests against the real local control plane (see operator_harness.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.operator_harness import CRD_FILE, NAMESPACE_PATTERN, Cluster, OperatorProcess


@pytest.fixture(scope="session")
def crd_installed(kube_cluster) -> None:
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/colocgrpojobs.colocgrpo.io")


@pytest.fixture(scope="session")
def cluster(kube_cluster) -> Cluster:
    return Cluster(kube_cluster)


@pytest.fixture(scope="session")
def operator(kube_cluster, crd_installed, tmp_path_factory) -> Iterator[OperatorProcess]:
    """One operator for the session, watching `opt-*` namespaces."""
    process = OperatorProcess(
        Path(kube_cluster.kubeconfig), [NAMESPACE_PATTERN], tmp_path_factory.mktemp("operator") / "operator.log"
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def op_namespace(kube_cluster, operator, request) -> Iterator[str]:
    """A fresh namespace the session operator watches."""
    hint = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().replace("test_", "")).strip("-")[:30]
    name = kube_cluster.new_namespace(f"opt-{hint}")
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- operator log (tail) ---\n{operator.log_tail()}")
    kube_cluster.delete_namespace(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
