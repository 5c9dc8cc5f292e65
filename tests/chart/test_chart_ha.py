"""The chart's two operator replicas stay up through a drain and a lost leader, on the real API server.

The release's pods run on KWOK's fake nodes, which run no containers but are scheduled, made Ready, evicted and
deleted as on a real cluster: the PodDisruptionBudget, the spread over nodes and the Eviction API act on them for
real. The operator processes behind those pods run on this host, one per pod, with the Deployment's own command
and the pod's name as their HOSTNAME (so their Lease identities name the pods), as the chart's ServiceAccount;
the test plays the kubelet and stops a pod's process when the pod is deleted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from installed_chart import HostOperator, InstalledChart, wait_for_rbac

from support.operator_harness import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def release(helm, kube_cluster, namespace) -> Iterator[InstalledChart]:
    """Two replicas (the default), watching only the test's namespace, with the NetworkPolicy on."""
    chart = InstalledChart(
        helm,
        kube_cluster,
        f"cgo-{uuid.uuid4().hex[:6]}",
        namespace,
        values=(
            "--set",
            f"watchNamespaces={{{namespace}}}",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            f"networkPolicy.ingressNamespaces={{{namespace}}}",
        ),
    ).install()
    yield chart
    chart.uninstall()


def _get(chart: InstalledChart, *args: str) -> dict[str, Any]:
    return json.loads(chart.cluster.kubectl("-n", chart.namespace, "get", *args, "-o", "json").stdout)


def _ready_pods(chart: InstalledChart) -> list[dict[str, Any]]:
    """The release's operator pods that are Ready and not being deleted."""
    selector = f"app.kubernetes.io/instance={chart.release},app.kubernetes.io/name=colocgrpo-operator"
    pods = _get(chart, "pods", "-l", selector)["items"]
    return [
        pod
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
    ]


def _disruptions_allowed(chart: InstalledChart) -> int | None:
    return (_get(chart, "poddisruptionbudget", chart.fullname).get("status") or {}).get("disruptionsAllowed")


def _two_ready_replicas(chart: InstalledChart) -> list[dict[str, Any]]:
    """Both replicas Ready and the budget's controller counting them: one eviction allowed."""
    wait_for(
        lambda: len(_ready_pods(chart)) == 2, 60, "two Ready operator pods", on_timeout=lambda: str(_get(chart, "pods"))
    )
    wait_for(lambda: _disruptions_allowed(chart) == 1, 60, "the budget to allow one eviction")
    return sorted(_ready_pods(chart), key=lambda pod: pod["metadata"]["name"])


def _evict(chart: InstalledChart, pod: dict[str, Any]) -> int:
    """POST the pod's eviction (policy/v1 Eviction API): 201 when the API server evicts it, else its refusal."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = pod["metadata"]["name"]
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=chart.namespace))
    try:
        chart.cluster.core_v1.create_namespaced_pod_eviction(name, chart.namespace, body)
    except ApiException as error:
        return int(error.status)
    return 201


def test_the_budget_lets_a_drain_evict_one_replica_at_a_time(release, kube_cluster):
    # The objects rendered and applied: the API server keeps them as rendered.
    budget = _get(release, "poddisruptionbudget", release.fullname)["spec"]
    assert budget["maxUnavailable"] == 1
    policy = _get(release, "networkpolicy", release.fullname)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert [p["namespaceSelector"]["matchLabels"] for p in policy["ingress"][0]["from"]] == [
        {"kubernetes.io/metadata.name": release.namespace}
    ]

    first, second = _two_ready_replicas(release)
    nodes = [first["spec"]["nodeName"], second["spec"]["nodeName"]]
    assert nodes[0] != nodes[1], f"both replicas on {nodes[0]}: the spread over nodes did not apply"

    # A drain of both nodes: cordoned, so no evicted replica can come back until one is uncordoned.
    for node in nodes:
        kube_cluster.kubectl("cordon", node)
    try:
        assert _evict(release, first) == 201
        assert _evict(release, second) == 429, "the second replica was evicted while the first was not back"
        assert _disruptions_allowed(release) == 0
        assert [pod["metadata"]["name"] for pod in _ready_pods(release)] == [second["metadata"]["name"]]

        # The first node back: the replacement replica runs there, and the second may go.
        kube_cluster.kubectl("uncordon", nodes[0])
        wait_for(lambda: len(_ready_pods(release)) == 2, 60, "the replacement replica to be Ready")
        replacement = next(p for p in _ready_pods(release) if p["metadata"]["name"] != second["metadata"]["name"])
        assert replacement["spec"]["nodeName"] == nodes[0]
        wait_for(lambda: _disruptions_allowed(release) == 1, 60, "the budget to allow one eviction again")
        assert _evict(release, second) == 201
    finally:
        for node in nodes:
            kube_cluster.kubectl("uncordon", node, check=False)


def _lease_holder(chart: InstalledChart) -> str:
    lease = json.loads(
        chart.cluster.kubectl("-n", chart.namespace, "get", "lease", chart.fullname, "-o", "json", check=False).stdout
        or "{}"
    )
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def test_the_standby_takes_the_lease_when_the_leaders_pod_is_deleted(release, kube_cluster, tmp_path):
    from colocgrpo_operator.api import JOB_NAME_LABEL

    pods = [pod["metadata"]["name"] for pod in _two_ready_replicas(release)]
    sa_kubeconfig = release.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    wait_for_rbac(kube_cluster, sa_kubeconfig, release.namespace)
    operators = {
        pod: HostOperator(
            release,
            sa_kubeconfig,
            tmp_path / f"{pod}.log",
            env={"HOSTNAME": pod, "POD_NAMESPACE": release.namespace},
        ).start()
        for pod in pods
    }

    def logs() -> str:
        return "\n".join(f"--- {pod}\n{operator.log_tail()}" for pod, operator in operators.items())

    try:
        holder = wait_for(lambda: _lease_holder(release), 60, "a replica to take the Lease", on_timeout=logs)
        (leader,) = [pod for pod in pods if holder.startswith(f"{pod}-")]
        (standby,) = [pod for pod in pods if pod != leader]
        wait_for(
            lambda: operators[standby].probe()[1].startswith("standby"), 60, "the standby's readiness", on_timeout=logs
        )

        # The leader's pod is deleted (a drain, a node going away); the kubelet then stops its container.
        kube_cluster.kubectl("-n", release.namespace, "delete", "pod", leader, "--wait=false")
        after = kube_cluster.kubectl("-n", release.namespace, "get", "pod", leader, "-o", "json", check=False)
        assert after.returncode != 0 or json.loads(after.stdout)["metadata"].get("deletionTimestamp")
        stopped = time.monotonic()
        operators[leader].stop()
        new_holder = wait_for(
            lambda: _lease_holder(release).startswith(f"{standby}-") and _lease_holder(release),
            30,
            "the standby to take the Lease",
            on_timeout=logs,
        )
        print(f"takeover after the leader's pod was deleted: {time.monotonic() - stopped:.1f} s ({new_holder})")
        wait_for(
            lambda: operators[standby].probe()[1].startswith("active"),
            60,
            "the new leader's readiness",
            on_timeout=logs,
        )

        # A job applied now gets its children from the new leader.
        job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
        job["metadata"] = {"name": "after-takeover", "namespace": release.namespace}
        kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        wait_for(
            lambda: _get(release, "jobs.batch", "-l", f"{JOB_NAME_LABEL}=after-takeover")["items"],
            60,
            "the job's batch Job",
            on_timeout=logs,
        )
        config_map = _get(release, "configmap", "after-takeover-config")
        assert config_map["metadata"]["ownerReferences"][0]["name"] == "after-takeover"
        assert operators[standby].running() and not operators[leader].running()
    finally:
        for operator in operators.values():
            operator.stop()
