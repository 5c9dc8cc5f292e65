"""The rendered dev-cluster config keeps everything on loopback and carries our stages (no cluster)."""

from __future__ import annotations

from pathlib import Path

import yaml

from colocgrpo_dev.cluster.binaries import Binaries
from colocgrpo_dev.cluster.gpu_nodes import render_gpu_nodes
from colocgrpo_dev.cluster.kwokctl_config import render_kwokctl_config


def test_kwokctl_config_is_loopback_only_with_rbac_and_our_stages(tmp_path):
    binaries = Binaries(folder=tmp_path, kubectl=tmp_path / "kubectl")
    docs = list(yaml.safe_load_all(render_kwokctl_config(binaries, tmp_path / "fake.log")))
    (kwokctl,) = [d for d in docs if d["kind"] == "KwokctlConfiguration"]
    assert kwokctl["options"]["bindAddress"] == "127.0.0.1"
    assert kwokctl["options"]["kubeAuthorization"] is True
    assert kwokctl["options"]["runtime"] == "binary"
    assert {"key": "node-ip", "value": "127.0.0.1"} in kwokctl["componentsPatches"][0]["extraArgs"]
    for key in (
        "kubeApiserverBinary",
        "kubeControllerManagerBinary",
        "kubeSchedulerBinary",
        "etcdBinary",
        "kwokControllerBinary",
    ):
        assert Path(kwokctl["options"][key]).parent == tmp_path  # local builds, never downloads
    stages = {d["metadata"]["name"] for d in docs if d["kind"] == "Stage"}
    assert {
        "colocgrpo-pod-ready",
        "colocgrpo-pod-exit-success",
        "colocgrpo-pod-exit-failure",
        "colocgrpo-pod-exit-oom",
        "colocgrpo-pod-evict",
        "colocgrpo-pod-terminate",
        "colocgrpo-pod-delete",
        "node-initialize",
    } <= stages
    assert any(d["kind"] == "ClusterLogs" for d in docs)


def test_gpu_node_pool_shape():
    nodes = render_gpu_nodes()
    assert [n["metadata"]["name"] for n in nodes] == ["fake-gpu-node-0", "fake-gpu-node-1"]
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["cpu"] == "64"
        assert node["status"]["capacity"]["memory"] == "512Gi"
        assert "taints" not in node.get("spec", {})
