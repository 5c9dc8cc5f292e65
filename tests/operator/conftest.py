"""Fixtures for operator tests against the real local control plane (see operator_harness.py)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from colocgrpo_dev.cluster.api_install import install_api
from colocgrpo_dev.cluster.diagnose import processes
from colocgrpo_dev.cluster.handle import ClusterHandle
from colocgrpo_dev.cluster.kueue import MANAGED_NAMESPACE_LABEL, LocalKueue, default_pid_dir
from support.operator_harness import (
    NAMESPACE_PATTERN,
    Cluster,
    OperatorProcess,
    add_session_probe,
    kueue_queues,
    session_state,
)


@pytest.fixture(scope="session")
def crd_installed(kube_cluster) -> None:
    """The CRD and the trainer status policy, as the chart and `colocgrpo-dev cluster up` install them."""
    install_api(kube_cluster.kubectl)


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
    add_session_probe("session operator", lambda: f"session {process.state()}")
    add_session_probe("session cluster", lambda: processes(Path(kube_cluster.kubeconfig)))
    yield process
    add_session_probe("session operator", None)
    add_session_probe("session cluster", None)
    process.stop()


@pytest.fixture
def op_namespace(kube_cluster, operator, request) -> Iterator[str]:
    """A fresh namespace the session operator watches."""
    hint = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().replace("test_", "")).strip("-")[:30]
    name = kube_cluster.new_namespace(f"opt-{hint}")
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        from colocgrpo_dev.cluster.diagnose import snapshot

        print(f"--- operator log (tail) ---\n{operator.log_tail()}")
        print(snapshot(kube_cluster.kubeconfig, name))
    kube_cluster.delete_namespace(name)


@dataclass
class Solo:
    """A control plane, an operator and a namespace of one test's own (`solo`)."""

    cluster: Cluster
    kube_cluster: ClusterHandle
    operator: OperatorProcess
    namespace: str


@pytest.fixture
def solo(request, tmp_path) -> Iterator[Solo]:
    """A control plane and an operator of this test's own, for a test that freezes or kills one of the control
    plane's processes: whatever state that leaves the cluster or the operator in ends with the test, instead of
    reaching every later test of the session (`<test cluster>-solo`, stopped afterwards unless
    COLOCGRPO_KEEP_CLUSTER=1). Skips where the tests run against a cluster of the user's (COLOCGRPO_KUBECONFIG)."""
    from colocgrpo_dev.cluster.cluster import DevCluster
    from colocgrpo_dev.cluster.diagnose import snapshot

    if os.environ.get("COLOCGRPO_KUBECONFIG"):
        pytest.skip("a control plane of the test's own needs `colocgrpo-dev cluster`, not COLOCGRPO_KUBECONFIG")
    dev = DevCluster(name=os.environ.get("COLOCGRPO_TEST_CLUSTER", "colocgrpo-test") + "-solo")
    try:
        handle = ClusterHandle(kubeconfig=dev.up())
        operator = OperatorProcess(Path(handle.kubeconfig), [NAMESPACE_PATTERN], tmp_path / "operator.log")
        operator.start()
        try:
            hint = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().replace("test_", "")).strip("-")[:30]
            namespace = handle.new_namespace(f"opt-{hint}")
            yield Solo(Cluster(handle), handle, operator, namespace)
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                print(f"--- operator log (tail) ---\n{operator.log_tail()}")
                print(snapshot(handle.kubeconfig, namespace))
        finally:
            operator.stop()
    finally:
        if os.environ.get("COLOCGRPO_KEEP_CLUSTER") != "1":
            dev.down()


# The session's operator and control plane as the first failure found them (printed again at the end of the run,
# which a CI log keeps when it drops the middle).
_FIRST_FAILURE: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    if report.failed and not _FIRST_FAILURE and session_state():
        found = [f"{item.nodeid} ({report.when}, {time.strftime('%H:%M:%S')}):", session_state()]
        namespace, kube = item.funcargs.get("op_namespace"), item.funcargs.get("kube_cluster")
        if namespace and kube is not None:
            from colocgrpo_dev.cluster.diagnose import snapshot

            # The test's pods and events, the nodes and the components' error lines, as the failure left them.
            found.append(snapshot(Path(kube.kubeconfig), namespace))
        _FIRST_FAILURE.append("\n".join(found))


def pytest_terminal_summary(terminalreporter) -> None:
    if _FIRST_FAILURE:
        terminalreporter.write_sep("-", "the session's operator and control plane at the first failure")
        terminalreporter.write_line(_FIRST_FAILURE[0])


# --- real Kueue (colocgrpo_dev.cluster.kueue), only for the tests that ask for it -----


@pytest.fixture(scope="session")
def kueue_leftovers() -> list[str]:
    """`kind/name` of what the Kueue tests deleted without waiting (see `kueue`)."""
    return []


@pytest.fixture(scope="session")
def kueue(kube_cluster, kueue_leftovers, tmp_path_factory) -> Iterator[LocalKueue]:
    """Kueue's manager (built from its Go module) against the session cluster, with one GPU
    ResourceFlavor. Only namespaces labelled MANAGED_NAMESPACE_LABEL are Kueue's.

    The tests' namespaces and ClusterQueues are deleted without waiting (deletion overlaps the
    next test); Kueue is stopped only once they are gone, as their Workloads' finalizers are its
    to remove."""
    kubeconfig = Path(kube_cluster.kubeconfig)
    pid_dir = default_pid_dir(kubeconfig)
    # Next to the cluster's own state when it is a DevCluster (`down` removes it); pytest's temp
    # folders are pruned by other sessions on the same machine.
    workdir = pid_dir.parent / "kueue" if pid_dir else tmp_path_factory.mktemp("kueue")
    process = LocalKueue(kubeconfig, workdir, pid_dir=pid_dir)
    process.start()
    try:
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(KUEUE_FLAVOR))
        yield process
        if kueue_leftovers:
            kube_cluster.kubectl("wait", "--for=delete", "--timeout=180s", *kueue_leftovers, check=False)
    finally:
        process.stop()


KUEUE_FLAVOR = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpu"}}


@pytest.fixture
def kueue_namespace(kube_cluster, operator, kueue, kueue_leftovers, request) -> Iterator[str]:
    """A fresh `opt-` namespace that Kueue manages, with a LocalQueue `gpu` feeding a ClusterQueue
    of its own (8 GPUs; CPU and memory enough for any test job; indirect parametrization adds to
    the ClusterQueue's spec). Deleted after the test (the `kueue` fixture waits for it)."""
    hint = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().replace("test_", "")).strip("-")[:24]
    name = kube_cluster.new_namespace(f"opt-kq-{hint}")
    key, value = MANAGED_NAMESPACE_LABEL
    kube_cluster.kubectl("label", "namespace", name, f"{key}={value}")
    queues = kueue_queues(name, cluster_queue=name, **getattr(request, "param", {}))
    kube_cluster.kubectl("apply", "-f", "-", input="\n".join(json.dumps(q) for q in queues))
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- operator log (tail) ---\n{operator.log_tail()}\n--- kueue log (tail) ---\n{kueue.log_tail(30)}")
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false")
    kube_cluster.kubectl("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")
    kueue_leftovers += [f"namespace/{name}", f"clusterqueue/{name}"]
