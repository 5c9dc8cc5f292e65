"""The kwokctl configuration of the dev cluster: local binaries, loopback only, RBAC, our stages.

kwokctl (`--runtime binary`) generates the PKI, picks free ports, starts every component as a
plain process and writes the kubeconfig; this file only tells it what to run and how.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.cluster.binaries import Binaries
from colocgrpo_dev.cluster.node.network import KUBERNETES_SERVICE_IP, SERVICE_CIDR, NodeNetwork
from colocgrpo_dev.cluster.paths import kwok_stages_dir

# The annotation every fake node carries (gpu_nodes.py): kwok plays the kubelet of these nodes only, never of the
# real node's (it would fake a status for the real node's pods).
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

# kwok serves `kubectl logs` from files in the CRI log format ("<time> <stream> <F|P> <line>").
FAKE_LOG_LINES = [
    "fake container started (KWOK runs no containers; these lines come from a kwok ClusterLogs file)",
    "fake container running",
]


def write_fake_log(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(f"2026-01-01T00:00:0{i}.000000000Z stdout F {line}\n" for i, line in enumerate(FAKE_LOG_LINES))
    )
    return path


def render_kwokctl_config(
    binaries: Binaries, fake_log: Path, node: NodeNetwork | None = None, pki_dir: Path | None = None
) -> str:
    """A multi-document kwok config: KwokctlConfiguration, node/pod Stages, ClusterLogs.

    With `node` (the real node's network, node/network.py), the API server is set up for a kubelet and for pods:
    its `kubernetes` Service points at the host end of the node's link (where the relay listens), its certificate
    names that address and the Service's, and it calls the kubelet with the cluster's admin certificate (from
    `pki_dir`, kwokctl's PKI folder of the cluster).
    """
    options = {
        "runtime": "binary",
        # kwokctl's default is 0.0.0.0; nothing of the dev cluster may listen beyond loopback.
        "bindAddress": "127.0.0.1",
        "securePort": True,
        "kubeAuthorization": True,  # --authorization-mode=Node,RBAC, SA signing key, SA token controller
        "kubeAdmission": True,  # the default admission chain (ServiceAccount, NamespaceLifecycle, ...)
        "kubeApiserverBinary": str(binaries["kube-apiserver"]),
        "kubeControllerManagerBinary": str(binaries["kube-controller-manager"]),
        "kubeSchedulerBinary": str(binaries["kube-scheduler"]),
        "kwokControllerBinary": str(binaries["kwok"]),
        "etcdBinary": str(binaries["etcd"]),
        "kubectlBinary": str(binaries.kubectl),
        "quietPull": True,
        # Per-pod fake logs (fake_logs.py) are kwok `Logs` objects in the cluster.
        "enableCRDs": ["Logs"],
    }
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": options,
            # The binary runtime leaves kwok's --node-ip empty, so nodes get no InternalIP and the
            # API server cannot reach kwok's kubelet endpoint (`kubectl logs`); the last flag wins.
            "componentsPatches": [
                {
                    "name": "kwok-controller",
                    "extraArgs": [
                        {"key": "node-ip", "value": "127.0.0.1"},
                        # kwokctl passes --manage-all-nodes=true; the last flag wins.
                        {"key": "manage-all-nodes", "value": "false"},
                        {"key": "manage-nodes-with-annotation-selector", "value": "=".join(FAKE_NODE_ANNOTATION)},
                    ],
                },
                # One of each, never replaced: leader election only adds a way to die. A leader
                # that cannot renew its lease for 10 s (an API server restarting slowly on a
                # loaded machine, or the process paused) exits, and nothing starts it again.
                {"name": "kube-controller-manager", "extraArgs": [{"key": "leader-elect", "value": "false"}]},
                {"name": "kube-scheduler", "extraArgs": [{"key": "leader-elect", "value": "false"}]},
            ],
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": {"name": "colocgrpo-fake-logs"},
            "spec": {"logs": [{"logsFile": str(fake_log), "previousLogsFile": str(fake_log)}]},
        },
    ]
    if node is not None:
        if pki_dir is None:
            raise ValueError("a cluster with a real node needs its PKI folder (pki_dir)")
        options["kubeApiserverCertSANs"] = [node.host_ip, KUBERNETES_SERVICE_IP]
        docs[0]["componentsPatches"].append(
            {"name": "kube-apiserver", "extraArgs": api_server_node_args(node, pki_dir)}
        )
    for stage_file in sorted((kwok_stages_dir()).glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(stage_file.read_text()) if d)
    return yaml.safe_dump_all(docs, sort_keys=False)


def api_server_node_args(node: NodeNetwork, pki_dir: Path) -> list[dict[str, str]]:
    """The API server's flags for a cluster with a real node (kwokctl's componentsPatches form)."""
    return [
        {"key": "advertise-address", "value": node.host_ip},
        {"key": "service-cluster-ip-range", "value": SERVICE_CIDR},
        # GPU pods tolerate the fake GPU nodes' nvidia.com/gpu taint without saying so, as on GPU clouds.
        {"key": "enable-admission-plugins", "value": "ExtendedResourceToleration"},
        # The kubelet by its InternalIP, the node's address on the link: never by its host name, which only the
        # machine's resolver could look up.
        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
        {"key": "kubelet-client-certificate", "value": str(pki_dir / "admin.crt")},
        {"key": "kubelet-client-key", "value": str(pki_dir / "admin.key")},
    ]
