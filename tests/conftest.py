"""Shared pytest fixtures. Keep each fixture small; the work lives in the packages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from colocgrpo_dev.cluster.handle import ClusterHandle

# --- the local control plane (colocgrpo_dev.cluster, docs/dev-cluster.md) ------------


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[ClusterHandle]:
    """A real control plane on 127.0.0.1 with 2 fake 8-GPU nodes, for the whole session.

    COLOCGRPO_KUBECONFIG=<path> reuses a running cluster (e.g. from `colocgrpo-dev cluster up`)
    and leaves it running; otherwise a cluster named `colocgrpo-test` (or $COLOCGRPO_TEST_CLUSTER, so
    two checkouts can test at once) is started (binaries are
    built first if missing) and stopped at the end, unless COLOCGRPO_KEEP_CLUSTER=1.
    """
    from colocgrpo_dev.cluster.cluster import DevCluster
    from colocgrpo_dev.cluster.handle import ClusterHandle

    if os.environ.get("COLOCGRPO_KUBECONFIG"):
        yield ClusterHandle(kubeconfig=Path(os.environ["COLOCGRPO_KUBECONFIG"]))
        return
    cluster = DevCluster(name=os.environ.get("COLOCGRPO_TEST_CLUSTER", "colocgrpo-test"))
    kubeconfig = cluster.up()
    try:
        yield ClusterHandle(kubeconfig=kubeconfig)
    finally:
        if os.environ.get("COLOCGRPO_KEEP_CLUSTER") != "1":
            cluster.down()


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[ClusterHandle]:
    """A second local cluster, with the real node (`cpu-node-0`, a kubelet on containerd that runs containers)
    beside the 2 fake GPU nodes, which carry the nvidia.com/gpu taint there; for the whole session.

    Named `<test cluster>-node` ($COLOCGRPO_TEST_CLUSTER-node), apart from `kube_cluster`, whose CPU pods must
    stay on fake nodes. Skips, with the one-line reason, on a machine that cannot run containers. Stopped at the
    end unless COLOCGRPO_KEEP_CLUSTER=1; its node's images stay in the cache, imported once.
    """
    from colocgrpo_dev.cluster.cluster import DevCluster
    from colocgrpo_dev.cluster.handle import ClusterHandle

    cluster = DevCluster(name=os.environ.get("COLOCGRPO_TEST_CLUSTER", "colocgrpo-test") + "-node", real_node=True)
    try:
        kubeconfig = cluster.up(timeout=300)
        if cluster.node_unavailable is not None:
            pytest.skip(f"no real node: {cluster.node_unavailable}")
        yield ClusterHandle(kubeconfig=kubeconfig, node=cluster.node)
    finally:
        if os.environ.get("COLOCGRPO_KEEP_CLUSTER") != "1":
            cluster.down()


@pytest.fixture
def namespace(kube_cluster, request) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = kube_cluster.new_namespace(request.node.name)
    yield name
    kube_cluster.delete_namespace(name)


def pytest_configure(config: pytest.Config) -> None:
    # Here rather than in pyproject.toml, whose every byte keys the dev venv.
    config.addinivalue_line(
        "markers", "node: runs containers (the real node, or the images in a containerd of their own); make test-node"
    )


# Folders whose every test runs containers: the images in a containerd of their own, the chart's operator on the node.
CONTAINER_FOLDERS = ("images", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses a cluster is a cluster test, marked or not (so `-m "not cluster"` works); one that runs
    # containers is a node test (`make test-node` runs those, `make test-operator` the rest).
    tests = Path(__file__).resolve().parent
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "kube_cluster" in fixtures or "node_cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
        path = Path(item.path).resolve()
        folder = path.relative_to(tests).parts[0] if path.is_relative_to(tests) else ""
        if "node_cluster" in fixtures or folder in CONTAINER_FOLDERS:
            item.add_marker(pytest.mark.node)
