"""The cluster DNS: CoreDNS as a Deployment on the real node behind the `kube-dns` Service, as kubeadm and kind
install it (the names, labels and Service address pods and NetworkPolicies expect), built from its Go module.

It answers `cluster.local` (Services, headless Services' pods, pod A records) and the reverse zones, and
nothing else: there is no `forward`, so no query ever leaves this machine.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_dev.cluster.node.config import CLUSTER_DOMAIN, COREDNS_IMAGE, REAL_NODE_LABEL
from colocgrpo_dev.cluster.node.network import DNS_SERVICE_IP

NAMESPACE = "kube-system"
NAME = "coredns"
LABELS = {"k8s-app": "kube-dns"}

COREFILE = f""".:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        ttl 30
    }}
    cache 30
    loadbalance
}}
"""


def manifests() -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and binding (what CoreDNS' kubernetes plugin reads), the Corefile, the
    Deployment (restricted: non-root, read-only root, no capabilities; it binds :53 in its own pod network, which
    needs none) and the Service at DNS_SERVICE_IP, the kubelet's clusterDNS."""
    meta = {"namespace": NAMESPACE, "labels": dict(LABELS)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"system:{NAME}", "labels": dict(LABELS)},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"system:{NAME}", "labels": dict(LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"system:{NAME}"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, **meta}, "data": {"Corefile": COREFILE}},
        _deployment(meta),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": dict(LABELS),
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]


def _deployment(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, **meta},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(LABELS)},
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {
                    "serviceAccountName": NAME,
                    "nodeSelector": {REAL_NODE_LABEL: "true"},
                    "dnsPolicy": "Default",
                    "priorityClassName": "system-cluster-critical",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                        # Binding port 53 needs no capability inside the pod's own network namespace.
                        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}],
                    },
                    "containers": [
                        {
                            "name": NAME,
                            "image": COREDNS_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                            ],
                            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": 8080},
                                "periodSeconds": 10,
                                "failureThreshold": 5,
                            },
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                },
            },
        },
    }
