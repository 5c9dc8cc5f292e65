"""The fake GPU node pool: Node objects that KWOK keeps Ready and "runs" pods on."""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api.naming import GPU_RESOURCE

# Beside a real node, the fake GPU nodes repel every pod that asks for no GPU, as GPU nodes on the clouds do; the
# API server's ExtendedResourceToleration admission gives a pod that asks for nvidia.com/gpu the toleration.
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


def render_gpu_nodes(
    count: int = 2, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", *, tainted: bool = False
) -> list[dict[str, Any]]:
    """Nodes shaped like 8-GPU training hosts. Untainted (any pod may land on them) unless `tainted`: in a cluster
    with a real node, pods that ask for no GPU go to the real node, where they run."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus), "ephemeral-storage": "1Ti"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"fake-gpu-node-{i}",
                # kwok's own convention, and what kwok selects the nodes it plays by (kwokctl_config.py).
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": f"fake-gpu-node-{i}",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.count": str(gpus),
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                },
            },
            **({"spec": {"taints": [dict(GPU_TAINT)]}} if tainted else {}),
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }
        for i in range(count)
    ]
