"""The real node's configuration as rendered (no cluster): every path its own, the settings this kind of
machine needs, the addresses inside its namespace, the images it makes from its binaries."""

from __future__ import annotations

import ipaddress
import json
import tarfile
import tomllib

import yaml

from colocgrpo_dev.cluster.binaries import Binaries
from colocgrpo_dev.cluster.gpu_nodes import GPU_TAINT, render_gpu_nodes
from colocgrpo_dev.cluster.kwokctl_config import FAKE_NODE_ANNOTATION, render_kwokctl_config
from colocgrpo_dev.cluster.node import dns
from colocgrpo_dev.cluster.node.config import (
    PAUSE_IMAGE,
    NodePaths,
    cni_network,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
)
from colocgrpo_dev.cluster.node.network import (
    DNS_SERVICE_IP,
    KUBERNETES_SERVICE_IP,
    LINK_RANGE,
    POD_CIDR,
    SERVICE_CIDR,
    NodeNetwork,
    free_link,
)
from colocgrpo_dev.cluster.node.oci import BinaryImage, write_archive

NETWORK = NodeNetwork.for_link("test", ipaddress.ip_network("10.213.0.4/30"))


def paths(tmp_path) -> NodePaths:
    return NodePaths(
        state=tmp_path / "state", containerd_root=tmp_path / "root", network_file=tmp_path / "network.json"
    )


def kwokctl_docs(tmp_path, node=None):
    binaries = Binaries(folder=tmp_path, kubectl=tmp_path / "kubectl")
    text = render_kwokctl_config(binaries, tmp_path / "fake.log", node, tmp_path / "pki")
    return list(yaml.safe_load_all(text))


def patches(docs, component):
    (kwokctl,) = [d for d in docs if d["kind"] == "KwokctlConfiguration"]
    return {
        arg["key"]: arg["value"]
        for patch in kwokctl["componentsPatches"]
        if patch["name"] == component
        for arg in patch["extraArgs"]
    }


def test_kwok_plays_only_the_fake_nodes(tmp_path):
    args = patches(kwokctl_docs(tmp_path), "kwok-controller")
    assert args["manage-all-nodes"] == "false"
    assert args["manage-nodes-with-annotation-selector"] == "kwok.x-k8s.io/node=fake"
    for node in render_gpu_nodes():
        key, value = FAKE_NODE_ANNOTATION
        assert node["metadata"]["annotations"][key] == value


def test_api_server_is_set_up_for_the_real_node_only_when_there_is_one(tmp_path):
    assert "kube-apiserver" not in {p for p in patches(kwokctl_docs(tmp_path), "kube-apiserver")}
    docs = kwokctl_docs(tmp_path, NETWORK)
    args = patches(docs, "kube-apiserver")
    assert args["advertise-address"] == NETWORK.host_ip  # the `kubernetes` Service's endpoint: the relay
    assert args["service-cluster-ip-range"] == SERVICE_CIDR
    assert args["kubelet-preferred-address-types"] == "InternalIP"  # never the machine's resolver
    assert args["enable-admission-plugins"] == "ExtendedResourceToleration"
    assert args["kubelet-client-certificate"] == str(tmp_path / "pki" / "admin.crt")
    (kwokctl,) = [d for d in docs if d["kind"] == "KwokctlConfiguration"]
    assert set(kwokctl["options"]["kubeApiserverCertSANs"]) == {NETWORK.host_ip, KUBERNETES_SERVICE_IP}
    assert kwokctl["options"]["bindAddress"] == "127.0.0.1"  # still loopback only


def test_fake_gpu_nodes_are_tainted_beside_a_real_node():
    for node in render_gpu_nodes(tainted=True):
        assert node["spec"]["taints"] == [GPU_TAINT]
    assert all("spec" not in node for node in render_gpu_nodes())


def test_containerd_keeps_every_path_its_own(tmp_path):
    node = paths(tmp_path)
    config = tomllib.loads(containerd_config(node))
    assert config["root"] == str(node.containerd_root)
    assert config["state"] == str(node.run)
    assert config["grpc"]["address"] == str(node.socket)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # root without CAP_SYS_RESOURCE
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == PAUSE_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"SystemdCgroup": False, "Root": str(node.run / "runc")}
    assert cri["cni"]["conf_dir"] == str(node.cni_conf_dir)
    text = containerd_config(node)
    assert '"/var/lib/containerd' not in text and '"/run/containerd' not in text  # not the machine's defaults


def test_pod_network_and_kubelet_settings(tmp_path):
    node = paths(tmp_path)
    (bridge, _portmap) = cni_network(node)["plugins"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR}]]
    assert bridge["ipam"]["dataDir"] == str(node.cni_ipam_dir)
    kubelet = kubelet_config(node, NETWORK, tmp_path / "ca.crt")
    assert kubelet["address"] == NETWORK.node_ip
    assert (kubelet["cgroupDriver"], kubelet["failCgroupV1"], kubelet["failSwapOn"]) == ("cgroupfs", False, False)
    assert kubelet["cgroupsPerQOS"] is False and kubelet["enforceNodeAllocatable"] == []
    assert kubelet["clusterDNS"] == [DNS_SERVICE_IP]
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{node.socket}"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["imageGCHighThresholdPercent"] == 100
    proxy = kube_proxy_config(NETWORK, tmp_path / "kubeconfig")
    assert proxy["clusterCIDR"] == POD_CIDR and proxy["conntrack"]["maxPerCore"] == 0


def test_the_service_and_dns_addresses_are_inside_the_service_range():
    services = ipaddress.ip_network(SERVICE_CIDR)
    assert ipaddress.ip_address(KUBERNETES_SERVICE_IP) == next(services.hosts())
    assert ipaddress.ip_address(DNS_SERVICE_IP) in services
    (service,) = [m for m in dns.manifests() if m["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == DNS_SERVICE_IP
    # Only the cluster's own names: no plugin that sends a query elsewhere.
    assert "forward" not in dns.COREFILE and "cluster.local" in dns.COREFILE


def test_free_link_skips_every_network_in_use():
    first = next(LINK_RANGE.subnets(new_prefix=30))
    assert free_link([]) == first
    used = [ipaddress.ip_network("10.213.0.0/29"), ipaddress.ip_network("10.213.0.9/32")]
    assert free_link(used) == ipaddress.ip_network("10.213.0.12/30")
    network = NodeNetwork.for_link("some-cluster", ipaddress.ip_network("10.213.0.12/30"))
    assert (network.host_ip, network.node_ip) == ("10.213.0.13", "10.213.0.14")
    assert len(network.host_interface) <= 15  # a Linux interface name


def test_one_binary_image_is_a_reproducible_oci_archive(tmp_path):
    binary = tmp_path / "probe"
    binary.write_bytes(b"\x7fELF not really")
    image = BinaryImage("localhost/test/probe:1", binary, user="10001:10001", args=("--flag",))
    first = write_archive(image, tmp_path / "a.tar")
    assert write_archive(image, tmp_path / "b.tar") == first  # same binary, same manifest digest
    with tarfile.open(tmp_path / "a.tar") as tar:
        index = json.load(tar.extractfile("index.json"))
        (entry,) = index["manifests"]
        assert entry["digest"] == first
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == "localhost/test/probe:1"
        manifest = json.load(tar.extractfile(f"blobs/sha256/{first.split(':')[1]}"))
        config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
        assert config["config"] == {"Entrypoint": ["/probe"], "User": "10001:10001", "Cmd": ["--flag"]}
        layer = tar.extractfile(f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}")
        with tarfile.open(fileobj=layer) as files:
            (member,) = files.getmembers()
            assert (member.name, member.mode, member.mtime) == ("probe", 0o755, 0)


def test_nodes_share_one_containerd_root_and_a_second_gets_its_own_until_it_stops(tmp_path, monkeypatch):
    from colocgrpo_dev.cluster.node.node import RealNode, shared_containerd_root

    monkeypatch.setenv("COLOCGRPO_CACHE", str(tmp_path / "cache"))
    first = RealNode.for_cluster("one", tmp_path / "clusters" / "one", tmp_path / "one.yaml")
    second = RealNode.for_cluster("two", tmp_path / "clusters" / "two", tmp_path / "two.yaml")
    assert first.paths.containerd_root == second.paths.containerd_root == shared_containerd_root()
    held = first._claim_root()  # what the first node's containerd inherits and holds
    try:
        assert first.paths.containerd_root == shared_containerd_root()
        with second._claim_root():
            own = second.paths.containerd_root
            assert own == tmp_path / "cache" / "containerd" / "node-two"
        # Read back from the node's state, as `cluster status` and `down` in another process do.
        again = RealNode.for_cluster("two", tmp_path / "clusters" / "two", tmp_path / "two.yaml")
        assert again.paths.containerd_root == own
        own.mkdir(parents=True)
        (own / "image-layer").write_text("a copy of the images")
        again.stop()
        assert not own.exists()
    finally:
        held.close()
    shared_containerd_root().mkdir(parents=True)
    first.stop()
    assert shared_containerd_root().is_dir()  # the shared root outlasts its node
    third = RealNode.for_cluster("two", tmp_path / "clusters" / "two", tmp_path / "two.yaml")
    with third._claim_root():  # free again: the second cluster's next node gets the shared root
        assert third.paths.containerd_root == shared_containerd_root()
