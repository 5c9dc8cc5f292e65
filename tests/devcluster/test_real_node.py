"""The real node of the dev cluster: a kubelet on containerd that runs pods in real containers, with the pod
network, kube-proxy's Services and the cluster DNS, beside the fake GPU nodes (node_cluster fixture)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator

import pytest

from colocgrpo_dev.cluster.gpu_nodes import GPU_TAINT
from colocgrpo_dev.cluster.node.config import NODE_NAME, REAL_NODE_LABEL
from colocgrpo_dev.cluster.node.network import DNS_SERVICE_IP, KUBERNETES_SERVICE_IP, POD_CIDR
from colocgrpo_operator.api.naming import GPU_RESOURCE
from support.node_probe import UID, finished_pod, pod, probe_image, restricted_pod, run_probe, wait_for


@pytest.fixture
def restricted(node_cluster, request) -> Iterator[str]:
    """A fresh namespace that enforces the restricted Pod Security Standard."""
    name = node_cluster.new_namespace(request.node.name)
    node_cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    yield name
    node_cluster.delete_namespace(name)


@pytest.fixture(scope="module")
def probe(node_cluster) -> str:
    return probe_image(node_cluster.node)


def nodes(cluster) -> dict[str, dict]:
    listing = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)
    return {node["metadata"]["name"]: node for node in listing["items"]}


def test_real_node_is_ready_beside_tainted_fake_gpu_nodes(node_cluster):
    found = nodes(node_cluster)
    assert set(found) == {NODE_NAME, "fake-gpu-node-0", "fake-gpu-node-1"}
    real = found[NODE_NAME]
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.5"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert real["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    # kwok plays only the fake nodes: the real node's status is the kubelet's own.
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})
    addresses = {a["type"]: a["address"] for a in real["status"]["addresses"]}
    assert addresses["InternalIP"] == node_cluster.node.network().node_ip
    assert not real["spec"].get("taints")
    for name in ("fake-gpu-node-0", "fake-gpu-node-1"):
        assert found[name]["spec"]["taints"] == [GPU_TAINT]


def test_restricted_pod_runs_to_completed_in_a_real_container(node_cluster, restricted, probe):
    finished, seen = run_probe(node_cluster, restricted, probe, "whoami", ["whoami"])
    status = finished["status"]
    assert finished["spec"]["nodeName"] == NODE_NAME
    assert ipaddress.ip_address(status["podIP"]) in ipaddress.ip_network(POD_CIDR)
    assert status["hostIP"] == node_cluster.node.network().node_ip
    (container,) = status["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert container["containerID"].startswith("containerd://")
    assert (seen["uid"], seen["gid"]) == (UID, UID)
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_bnd"], 16) == 0  # ALL dropped
    assert seen["no_new_privs"] == "1"  # allowPrivilegeEscalation: false
    assert seen["seccomp"] == "2"  # a filter: RuntimeDefault
    assert seen["root_writable"] is False  # readOnlyRootFilesystem
    assert seen["hostname"] == "whoami"


def test_pod_reaches_the_api_server_through_the_kubernetes_service(node_cluster, restricted, probe):
    node_cluster.kubectl("-n", restricted, "create", "serviceaccount", "prober")
    spec = restricted_pod("apiserver", probe, ["apiserver"], serviceAccountName="prober")
    node_cluster.kubectl("-n", restricted, "apply", "-f", "-", input=json.dumps(spec))
    finished = finished_pod(node_cluster, restricted, "apiserver")
    logs = node_cluster.kubectl("-n", restricted, "logs", "apiserver").stdout
    assert finished["status"]["phase"] == "Succeeded", logs
    seen = json.loads(logs.strip().splitlines()[-1])
    assert seen["address"] == f"{KUBERNETES_SERVICE_IP}:443"
    assert seen["status"] == 200 and seen["version"]["gitVersion"] == "v1.36.5"


def test_services_and_pod_hostnames_resolve_and_answer(node_cluster, restricted, probe):
    # A server behind a ClusterIP Service and a headless Service that names its pod (as a job's gang is named).
    server = restricted_pod("server-0", probe, ["serve", "8080"], hostname="server-0", subdomain="gang")
    server["spec"]["restartPolicy"] = "Always"
    services = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {
                **({"clusterIP": "None"} if name == "gang" else {}),
                "selector": {"app": "server-0"},
                "ports": [{"port": 80 if name == "web" else 8080, "targetPort": 8080}],
            },
        }
        for name in ("web", "gang")
    ]
    node_cluster.kubectl(
        "-n",
        restricted,
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [server, *services]}),
    )
    wait_for(lambda: pod(node_cluster, restricted, "server-0")["status"].get("podIP"), "the server's pod IP")
    server_ip = pod(node_cluster, restricted, "server-0")["status"]["podIP"]
    web_ip = json.loads(node_cluster.kubectl("-n", restricted, "get", "service", "web", "-o", "json").stdout)["spec"][
        "clusterIP"
    ]
    names = [
        f"web.{restricted}.svc.cluster.local",
        "web",  # through the pod's search path
        f"server-0.gang.{restricted}.svc.cluster.local",
        "server-0.gang",
        "kubernetes.default",
        "kube-dns.kube-system",
        "example.com",  # nothing outside the cluster resolves: no query leaves the machine
    ]
    _, resolved = run_probe(node_cluster, restricted, probe, "resolver", ["resolve", *names])
    assert resolved[f"web.{restricted}.svc.cluster.local"] == [web_ip] == resolved["web"]
    assert resolved[f"server-0.gang.{restricted}.svc.cluster.local"] == [server_ip] == resolved["server-0.gang"]
    assert resolved["kubernetes.default"] == [KUBERNETES_SERVICE_IP]
    assert resolved["kube-dns.kube-system"] == [DNS_SERVICE_IP]
    assert "error" in resolved["example.com"]
    # The Service's address answers through kube-proxy's rules; the headless name reaches the pod itself.
    _, through_service = run_probe(node_cluster, restricted, probe, "client-svc", ["dial", f"web.{restricted}:80"])
    assert through_service["reply"] == "server-0"
    _, direct = run_probe(node_cluster, restricted, probe, "client-pod", ["dial", "server-0.gang:8080"])
    assert direct["reply"] == "server-0"


def test_gpu_pods_go_to_the_fake_gpu_nodes_and_others_to_the_real_node(node_cluster, restricted, probe):
    gpu = restricted_pod("gpu", probe, ["whoami"])
    gpu["spec"]["containers"][0]["resources"] = {"limits": {GPU_RESOURCE: 1}}
    cpu = restricted_pod("cpu", probe, ["whoami"])
    node_cluster.kubectl(
        "-n",
        restricted,
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [gpu, cpu]}),
    )
    placed = {
        name: wait_for(
            lambda name=name: pod(node_cluster, restricted, name)["spec"].get("nodeName"), f"{name} scheduled"
        )
        for name in ("gpu", "cpu")
    }
    assert placed["gpu"].startswith("fake-gpu-node-")
    assert placed["cpu"] == NODE_NAME
    # The admission plugin gave the GPU pod the taint's toleration; the fake pod is kwok's to run (it stays Running).
    tolerations = pod(node_cluster, restricted, "gpu")["spec"]["tolerations"]
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert wait_for(lambda: pod(node_cluster, restricted, "gpu")["status"].get("phase") == "Running", "the fake pod")
    assert finished_pod(node_cluster, restricted, "cpu")["status"]["phase"] == "Succeeded"
