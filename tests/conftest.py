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


@pytest.fixture
def namespace(kube_cluster, request) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = kube_cluster.new_namespace(request.node.name)
    yield name
    kube_cluster.delete_namespace(name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses the cluster is a cluster test, marked or not (so `-m "not cluster"` works).
    for item in items:
        if "kube_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
