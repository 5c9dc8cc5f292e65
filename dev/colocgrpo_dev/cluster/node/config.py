"""The real node's configuration files, as pure functions of its folders and addresses: containerd's
config, the CNI network, the kubelet's and kube-proxy's configs, their kubeconfigs.

Each setting this kind of machine needs (and why) is said where it is set; docs/dev-cluster.md has the
summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.cluster.node.network import DNS_SERVICE_IP, POD_CIDR, NodeNetwork

NODE_NAME = "cpu-node-0"
# The label that tells the real node from the fake ones (whose label is type=kwok).
REAL_NODE_LABEL = "colocgrpo.dev/real-node"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:v1.15.0-colocgrpo"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CLUSTER_DOMAIN = "cluster.local"
# containerd's namespace for the CRI plugin (fixed by containerd); images the kubelet runs are imported there.
CRI_NAMESPACE = "k8s.io"


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps its files. `state` is the per-run folder (removed by `down`); `containerd_root`
    (images, snapshots) lives in the cache and, shared by the clusters' nodes, outlasts it (node.py);
    `network_file` records the node's network (network.py) from the moment it is made until it is deleted."""

    state: Path
    containerd_root: Path
    network_file: Path

    @property
    def run(self) -> Path:
        """containerd's state folder (sockets, task bundles, pods' network namespaces)."""
        return self.state / "run"

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.state / "containerd.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.state / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.state / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.state / "pod-logs"

    @property
    def resolv_conf(self) -> Path:
        return self.state / "resolv.conf"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def logs(self) -> Path:
        return self.state / "logs"


def containerd_config(paths: NodePaths) -> str:
    """containerd 1.6's config (version 2) with the CRI plugin for the kubelet; every path is the node's own,
    so it never meets the machine's containerd (or another node's, or the image tests')."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{paths.containerd_root}"
state = "{paths.run}"

[grpc]
  address = "{paths.socket}"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{paths.containerd_root / "opt"}"

  [{cri}]
    sandbox_image = "{PAUSE_IMAGE}"
    # Root on this kind of machine lacks CAP_SYS_RESOURCE, so runc cannot lower a process's oom_score_adj:
    # every sandbox failed ("can't get final child's PID from pipe") until containerd was told to keep the
    # kubelet's scores at or above its own.
    restrict_oom_score_adj = true
    # Pods' network namespaces are mounted under the state folder, not the machine's /var/run/netns.
    netns_mounts_under_state_dir = true
    enable_selinux = false
    # `kubectl exec/attach/port-forward` streams, served inside the node's network namespace.
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

  [{cri}.containerd.runtimes.runc.options]
    # cgroup v1 and no systemd here: the kubelet's cgroupDriver is cgroupfs too.
    SystemdCgroup = false
    Root = "{paths.run / "runc"}"

  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{paths.cni_conf_dir}"
    max_conf_num = 1
"""


def cni_network(paths: NodePaths) -> dict[str, Any]:
    """The pods' network: Debian's bridge and host-local plugins, one /24 on the bridge `cni0` in the node's
    namespace. ipMasq gives a pod's traffic to the link (the API server's relay) the node's address; hairpin lets
    a pod reach itself through a Service."""
    return {
        "cniVersion": "1.0.0",
        "name": "colocgrpo",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: NodePaths, network: NodeNetwork, ca_file: Path) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration for this kind of machine (cgroup v1, no systemd, no swap accounting,
    root without CAP_SYS_RESOURCE, a disk shared with other work)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Served on the node's own address, inside its namespace; the API server reaches it over the link.
        "address": network.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        # cgroup v1 with cgroupfs (no systemd as PID 1 here): kubelet 1.36 refuses cgroup v1 unless told not to.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        # The machine may have swap the kubelet cannot account for; it must start anyway.
        "failSwapOn": False,
        # No QoS cgroup hierarchy: it would need writable top-level cgroups and a systemd-free layout the kubelet
        # owns. Each container still gets its own cgroup with the pod's limits. Without the hierarchy there is
        # nothing to enforce node-allocatable on.
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # Pods learn no search domains or servers of the machine: cluster names only, nothing resolves outside.
        "resolvConf": str(paths.resolv_conf),
        "podLogsDir": str(paths.pod_logs),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        # The disk is shared with other work that fills and frees it: never evict pods, taint the node or delete
        # images because it runs low (the eviction manager reclaims disk by deleting every unused image, the
        # pause image included, which no registry here can give back). 0% switches a threshold off.
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "nodeStatusReportFrequency": "10s",
    }


def kube_proxy_config(network: NodeNetwork, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode inside the node's namespace; it leaves the machine-wide conntrack sysctls alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": network.node_ip,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # nf_conntrack_max and the TCP timeouts are global to the machine: never touched.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
    }


def kubeconfig(server: str, ca_file: Path, cert_file: Path, key_file: Path, user: str) -> dict[str, Any]:
    """A kubeconfig with a client certificate (the kubelet's, kube-proxy's)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert_file), "client-key": str(key_file)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }


def dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False)


def dump_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2)
