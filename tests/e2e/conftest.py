"""Fixtures of the end-to-end suite: the chart's operator running in the cluster with the real node, the project's
images in the node's runtime, restricted namespaces and volumes for jobs."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from colocgrpo_dev.in_cluster import OperatorRelease, load_images, restricted_namespace

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def images(node_cluster) -> dict[str, str]:
    """The operator and trainer images (built from their Dockerfiles, `make images`) in the node's runtime."""
    return load_images(node_cluster.node)


@pytest.fixture(scope="session")
def operator_release(node_cluster, images) -> Iterator[OperatorRelease]:
    """The chart installed with helm as a user installs it (defaults: 2 replicas, leader election, the chart's
    RBAC) plus its NetworkPolicy, into a namespace that enforces the restricted Pod Security Standard."""
    release = OperatorRelease.on(node_cluster)
    release.install()
    yield release
    release.uninstall()


@pytest.fixture
def job_namespace(node_cluster, operator_release, request) -> Iterator[str]:
    """A fresh namespace for one test's jobs, enforcing the restricted Pod Security Standard."""
    name = restricted_namespace(node_cluster, node_cluster.new_namespace(request.node.name))
    yield name
    node_cluster.delete_namespace(name)


@dataclass
class HostVolume:
    """A PersistentVolumeClaim bound to a hostPath PersistentVolume on the real node: what the job's pods write is
    in `path` on this machine."""

    claim: str
    path: Path


@pytest.fixture
def job_volume(node_cluster, job_namespace) -> Iterator[HostVolume]:
    """A 1Gi ReadWriteMany claim named `job-volume` in the test's namespace (the pods mount it; a restricted pod may
    mount a claim, never a hostPath), its folder writable by the trainer's uid."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    path = node_cluster.node.paths.state / "volumes" / name
    path.mkdir(parents=True)
    path.chmod(0o777)
    claim = "job-volume"
    volume: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": job_namespace, "name": claim},
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }
    claim_object = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": job_namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    import json

    node_cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [volume, claim_object]})
    )
    yield HostVolume(claim=claim, path=path)
    node_cluster.kubectl("delete", "persistentvolume", name, "--wait=false", check=False)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def kubectl_plugin_env() -> dict[str, str]:
    """The environment in which `kubectl colocgrpo` is this checkout's CLI (the console script beside this
    interpreter, this checkout's code first)."""
    return dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}",
    )
