"""The real node's network: a network namespace of its own, joined to this machine by one veth link.

    this machine (host namespace)                 the node's namespace (`colocgrpo-<cluster>`)
    127.0.0.1: API server, etcd, kwok              kubelet, kube-proxy, containerd (and the CNI plugins it runs)
    <link>.1/30 on veth `cg<hash>` ------------- <link>.2/30 on `eth0`: the Node's InternalIP
      the relay: <link>.1:<API port> -> 127.0.0.1   bridge `cni0` 10.244.0.1/24: the pods (POD_CIDR)
                                                    Service IPs (SERVICE_CIDR) by kube-proxy's rules here

Everything the node and its pods do stays inside: the node's namespace has no default route (only the
link's /30 and the pods' bridge), so a pod reaches the other pods, the Services and, through the relay,
the API server, and nothing else; kube-proxy's and the CNI plugins' iptables rules, the bridge and the
pods' addresses are the namespace's own, so two clusters' nodes never meet, and the machine's own
network settings are never changed. The machine gets only the host end of the link, a /30 out of
LINK_RANGE that no other interface or route uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from colocgrpo_dev.cluster.commands import run
from colocgrpo_dev.cluster.locking import file_lock

# Pods and Services exist only inside the node's namespace, so every cluster may use the same ranges.
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"  # the API server's default, set explicitly so the DNS address below is inside
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
DNS_SERVICE_IP = "10.0.0.10"  # the cluster DNS Service (kube-dns), the kubelet's clusterDNS
# The host ends of the links: one /30 per running node.
LINK_RANGE = ipaddress.IPv4Network("10.213.0.0/16")
NODE_INTERFACE = "eth0"


@dataclass(frozen=True)
class NodeNetwork:
    """The names and addresses of one node's network (all derived from the cluster's name and its /30)."""

    netns: str
    host_interface: str
    host_ip: str
    node_ip: str
    prefix: int = 30

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @classmethod
    def for_link(cls, cluster: str, link: ipaddress.IPv4Network) -> NodeNetwork:
        hosts = list(link.hosts())
        digest = hashlib.sha256(cluster.encode()).hexdigest()[:8]
        return cls(
            netns=f"colocgrpo-{cluster}",
            host_interface=f"cg{digest}",
            host_ip=str(hosts[0]),
            node_ip=str(hosts[1]),
            prefix=link.prefixlen,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> NodeNetwork:
        return cls(**json.loads(text))


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine's host namespace has an address or a route in."""
    used: list[ipaddress.IPv4Network] = []
    addresses = json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
    for interface in addresses:
        for info in interface.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]"):
        destination = route.get("dst", "")
        if destination and destination != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(destination if "/" in destination else f"{destination}/32"))
    return used


def free_link(used: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /30 of LINK_RANGE that overlaps nothing in `used`."""
    for candidate in LINK_RANGE.subnets(new_prefix=30):
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError(f"no free /30 left in {LINK_RANGE} for the real node's link")


def netns_exists(name: str) -> bool:
    return (Path("/run/netns") / name).exists()


def create(cluster: str, lock_file: Path) -> NodeNetwork:
    """Make the node's namespace and link for `cluster` (a new /30), with loopback up and forwarding on inside."""
    with file_lock(lock_file):  # two clusters starting at once must not pick the same /30
        network = NodeNetwork.for_link(cluster, free_link(used_networks()))
        delete(network)  # a namespace or link left by a crash
        run(["ip", "netns", "add", network.netns])
        run(
            [
                "ip",
                "link",
                "add",
                network.host_interface,
                "type",
                "veth",
                "peer",
                "name",
                NODE_INTERFACE,
                "netns",
                network.netns,
            ]
        )
        run(["ip", "addr", "add", f"{network.host_ip}/{network.prefix}", "dev", network.host_interface])
        run(["ip", "link", "set", network.host_interface, "up"])
    inside = in_netns(network)
    run([*inside, "ip", "addr", "add", f"{network.node_ip}/{network.prefix}", "dev", NODE_INTERFACE])
    run([*inside, "ip", "link", "set", NODE_INTERFACE, "up"])
    run([*inside, "ip", "link", "set", "lo", "up"])
    # Per namespace: pods' packets are routed through the node's namespace (the bridge is their gateway),
    # and bridged packets pass iptables so kube-proxy's rules see pod-to-Service-to-pod traffic on one bridge.
    run([*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    with contextlib.suppress(
        subprocess.CalledProcessError
    ):  # absent without br_netfilter: hairpin then needs masquerade
        run([*inside, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"])
    return network


def delete(network: NodeNetwork) -> None:
    """Remove the namespace (with the node's end of the link, the bridge and every rule in it) and the host end."""
    if netns_exists(network.netns):
        run(["ip", "netns", "delete", network.netns], check=False)
    run(["ip", "link", "delete", network.host_interface], check=False)


def in_netns(network: NodeNetwork) -> list[str]:
    """The command prefix that runs a program in the node's network namespace, and only that namespace (its
    mounts, cgroups and processes stay the machine's: `ip netns exec` would remount /sys, hiding the cgroups)."""
    return ["nsenter", f"--net={network.netns_path}", "--"]
