"""The KWOK stages hold pods Running and end them the way tests ask, like a kubelet would."""

from __future__ import annotations

import time

import pytest

from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success, evict_pod, wait_for_pod_phase
from colocgrpo_dev.cluster.kwokctl_config import FAKE_LOG_LINES

pytestmark = pytest.mark.cluster


def running_pod(kube_cluster, namespace: str, name: str, containers: int = 1, finalizers: list[str] | None = None):
    kube_cluster.core_v1.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "finalizers": finalizers or []},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": f"c{i}", "image": "example.invalid/none"} for i in range(containers)],
            },
        },
    )
    return wait_for_pod_phase(kube_cluster.core_v1, namespace, name, "Running")


def terminated(pod):
    return [status.state.terminated for status in pod.status.container_statuses]


def test_success(kube_cluster, namespace):
    running_pod(kube_cluster, namespace, "ok", containers=2)
    drive_pod_success(kube_cluster.core_v1, namespace, "ok")
    pod = wait_for_pod_phase(kube_cluster.core_v1, namespace, "ok", "Succeeded")
    assert [(t.exit_code, t.reason) for t in terminated(pod)] == [(0, "Completed")] * 2


def test_failure_with_exit_code_and_message(kube_cluster, namespace):
    running_pod(kube_cluster, namespace, "crash")
    drive_pod_failure(kube_cluster.core_v1, namespace, "crash", exit_code=3, message="NCCL timeout: rank 1")
    pod = wait_for_pod_phase(kube_cluster.core_v1, namespace, "crash", "Failed")
    (t,) = terminated(pod)
    assert (t.exit_code, t.reason, t.message) == (3, "Error", "NCCL timeout: rank 1")


def test_oom_killed(kube_cluster, namespace):
    running_pod(kube_cluster, namespace, "oom")
    drive_pod_failure(kube_cluster.core_v1, namespace, "oom", reason="OOMKilled", message="")
    pod = wait_for_pod_phase(kube_cluster.core_v1, namespace, "oom", "Failed")
    (t,) = terminated(pod)
    assert (t.exit_code, t.reason) == (137, "OOMKilled")


def test_eviction_sets_disruption_target(kube_cluster, namespace):
    running_pod(kube_cluster, namespace, "evicted")
    evict_pod(kube_cluster.core_v1, namespace, "evicted", message="The node was low on resource: memory.")
    pod = wait_for_pod_phase(kube_cluster.core_v1, namespace, "evicted", "Failed")
    assert pod.status.reason == "Evicted"
    disruption = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert [(c.status, c.reason) for c in disruption] == [("True", "TerminationByKubelet")]


def test_kubectl_logs_of_a_fake_pod(kube_cluster, namespace):
    running_pod(kube_cluster, namespace, "talker")
    out = kube_cluster.kubectl("logs", "-n", namespace, "talker").stdout
    assert out.splitlines() == FAKE_LOG_LINES


def test_eviction_api_marks_deletes_and_terminates(kube_cluster, namespace):
    from kubernetes import client

    # A finalizer holds the pod until its marks are read: KWOK can otherwise remove it before the read.
    hold = "colocgrpo.io/test-hold"
    running_pod(kube_cluster, namespace, "api-evicted", finalizers=[hold])
    kube_cluster.core_v1.create_namespaced_pod_eviction(
        "api-evicted",
        namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name="api-evicted", namespace=namespace)),
    )
    pod = kube_cluster.core_v1.read_namespaced_pod("api-evicted", namespace)
    assert pod.metadata.deletion_timestamp is not None
    assert any(c.type == "DisruptionTarget" and c.reason == "EvictionByEvictionAPI" for c in pod.status.conditions)
    kube_cluster.core_v1.patch_namespaced_pod("api-evicted", namespace, {"metadata": {"finalizers": None}})

    def gone():
        return not kube_cluster.core_v1.list_namespaced_pod(namespace, field_selector="metadata.name=api-evicted").items

    deadline = time.monotonic() + 30
    while not gone():
        assert time.monotonic() < deadline, "the evicted pod was never removed"
        time.sleep(0.2)


def test_per_pod_fake_logs_and_appending(kube_cluster, namespace):
    from colocgrpo_dev.cluster.fake_logs import append_fake_logs

    running_pod(kube_cluster, namespace, "rank0", containers=2)
    log_file = kube_cluster.set_fake_logs(namespace, "rank0", ["step 1 reward 0.1"], container="c0")

    def logs(container):
        return kube_cluster.kubectl("logs", "-n", namespace, "rank0", "-c", container, check=False).stdout

    deadline = time.monotonic() + 15
    while logs("c0") != "step 1 reward 0.1\n":  # kwok picks the Logs object up through a watch
        assert time.monotonic() < deadline, logs("c0")
        time.sleep(0.2)
    append_fake_logs(log_file, ["step 2 reward 0.3"])
    assert logs("c0").splitlines() == ["step 1 reward 0.1", "step 2 reward 0.3"]
    assert logs("c1").splitlines() == FAKE_LOG_LINES  # other containers keep the cluster-wide lines
