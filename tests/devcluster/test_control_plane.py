"""Proof that the dev cluster is a real control plane: API validation, RBAC, scheduler,
Job and garbage-collector controllers, and KWOK fake GPU nodes driven by the tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from colocgrpo_dev.cluster import drive_pod_success, wait_for_pod_phase
from colocgrpo_dev.cluster.gpu_nodes import GPU_RESOURCE

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
PROJECT_CRD = REPO / "charts" / "colocgrpo-operator" / "crds" / "colocgrpojobs.colocgrpo.io.yaml"

# A small CRD with a CEL rule, so the CEL path is proven even before the project's CRD exists.
PROBE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "celprobes.devcluster.colocgrpo.dev"},
    "spec": {
        "group": "devcluster.colocgrpo.dev",
        "scope": "Namespaced",
        "names": {"plural": "celprobes", "singular": "celprobe", "kind": "CelProbe"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "gpusPerNode": {"type": "integer"},
                                    "tensorParallel": {"type": "integer"},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.gpusPerNode % self.tensorParallel == 0",
                                        "message": "tensorParallel must divide gpusPerNode",
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def until(predicate, timeout: float = 30, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def apply_crd(kube_cluster, crd: dict) -> str:
    kube_cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(crd))
    name = crd["metadata"]["name"]
    extensions = client.ApiextensionsV1Api(kube_cluster.api_client)

    # Polled here: `kubectl wait` fails outright while a new CRD has no conditions yet.
    def established():
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    until(established, what=f"CRD {name} Established")
    return name


def gpu_job(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "example.invalid/trainer:none",  # never pulled: KWOK runs nothing
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                        }
                    ],
                }
            },
        },
    }


def job_condition_is_true(batch, namespace, name, condition_type):
    conditions = batch.read_namespaced_job_status(name, namespace).status.conditions or []
    return any(c.type == condition_type and c.status == "True" for c in conditions)


def job_pods(core_v1, namespace: str, job: str) -> list:
    return core_v1.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items


def test_crd_cel_rule_stores_valid_and_rejects_invalid(kube_cluster, namespace):
    apply_crd(kube_cluster, PROBE_CRD)
    custom = client.CustomObjectsApi(kube_cluster.api_client)
    args = ("devcluster.colocgrpo.dev", "v1", namespace, "celprobes")

    def probe(name: str, gpus: int, tp: int) -> dict:
        return {
            "apiVersion": "devcluster.colocgrpo.dev/v1",
            "kind": "CelProbe",
            "metadata": {"name": name},
            "spec": {"gpusPerNode": gpus, "tensorParallel": tp},
        }

    # The CRD is served a moment after Established; retry the first create on 404.
    until(lambda: _created(custom, args, probe("valid", 8, 4)), what="CRD to be served")
    assert custom.get_namespaced_custom_object(*args, "valid")["spec"]["tensorParallel"] == 4
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(*args, probe("invalid", 8, 3))
    assert rejected.value.status == 422
    assert "tensorParallel must divide gpusPerNode" in rejected.value.body


def _created(custom, args, body) -> bool:
    try:
        custom.create_namespaced_custom_object(*args, body)
        return True
    except ApiException as error:
        if error.status == 404:
            return False
        raise


@pytest.mark.skipif(not PROJECT_CRD.is_file(), reason="the project's CRD is not generated yet")
def test_project_crd_is_accepted(kube_cluster):
    crd = yaml.safe_load(PROJECT_CRD.read_text())
    apply_crd(kube_cluster, crd)


def test_gpu_job_is_scheduled_to_a_fake_gpu_node_and_completes(kube_cluster, namespace):
    batch = client.BatchV1Api(kube_cluster.api_client)
    core = kube_cluster.core_v1
    batch.create_namespaced_job(namespace, gpu_job("train", gpus=8))
    (pod,) = until(lambda: job_pods(core, namespace, "train"), what="the Job's pod")
    running = wait_for_pod_phase(core, namespace, pod.metadata.name, "Running")
    assert running.spec.node_name.startswith("fake-gpu-node-")
    assert all(c.ready for c in running.status.container_statuses)
    time.sleep(1)  # still Running: KWOK holds pods until a test drives them
    assert core.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Running"

    drive_pod_success(core, namespace, pod.metadata.name)

    until(lambda: job_condition_is_true(batch, namespace, "train", "Complete"), what="Job Complete")


def test_deleting_an_owner_garbage_collects_its_children(kube_cluster, namespace):
    batch = client.BatchV1Api(kube_cluster.api_client)
    core = kube_cluster.core_v1
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
                ],
            }
        },
    )
    batch.create_namespaced_job(namespace, gpu_job("owned", gpus=1))
    (pod,) = until(lambda: job_pods(core, namespace, "owned"), what="the Job's pod")
    wait_for_pod_phase(core, namespace, pod.metadata.name, "Running")

    core.delete_namespaced_config_map("owner", namespace)
    batch.delete_namespaced_job("owned", namespace, propagation_policy="Background")

    until(
        lambda: not core.list_namespaced_config_map(namespace, field_selector="metadata.name=child").items,
        what="the child ConfigMap to be collected",
    )
    # The running pod is terminated (KWOK plays the kubelet) and then removed.
    until(lambda: not job_pods(core, namespace, "owned"), what="the Job's pod to be collected")


def test_pod_asking_more_gpus_than_any_node_stays_pending(kube_cluster, namespace):
    core = kube_cluster.core_v1
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "too-big"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "example.invalid/none", "resources": {"limits": {GPU_RESOURCE: "9"}}}
                ]
            },
        },
    )

    def unschedulable():
        pod = core.read_namespaced_pod("too-big", namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return pod, condition
        return None

    pod, condition = until(unschedulable, what="the scheduler's verdict")
    assert pod.status.phase == "Pending"
    assert condition.reason == "Unschedulable"
    assert f"Insufficient {GPU_RESOURCE}" in condition.message


def test_service_account_token_with_narrow_role_is_refused_the_rest(kube_cluster, namespace):
    core = kube_cluster.core_v1
    rbac = client.RbacAuthorizationV1Api(kube_cluster.api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    configuration = client.Configuration()
    configuration.host = kube_cluster.api_client.configuration.host
    configuration.ssl_ca_cert = kube_cluster.api_client.configuration.ssl_ca_cert
    configuration.verify_ssl = kube_cluster.api_client.configuration.verify_ssl
    configuration.api_key = {"authorization": f"Bearer {token}"}
    as_reader = client.CoreV1Api(client.ApiClient(configuration))

    assert as_reader.list_namespaced_pod(namespace).items == []  # what the Role allows
    for refused in (
        lambda: as_reader.list_namespaced_secret(namespace),
        lambda: as_reader.create_namespaced_pod(
            namespace,
            {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}},
        ),
        lambda: as_reader.list_namespaced_pod("default"),
    ):
        with pytest.raises(ApiException) as denied:
            refused()
        assert denied.value.status == 403
        assert f"system:serviceaccount:{namespace}:reader" in denied.value.body


def test_suspended_job_starts_when_unsuspended_and_stops_when_suspended(kube_cluster, namespace):
    """Kueue is not installed: tests play it by flipping spec.suspend."""
    batch = client.BatchV1Api(kube_cluster.api_client)
    core = kube_cluster.core_v1
    job = gpu_job("queued", gpus=8)
    job["spec"]["suspend"] = True
    batch.create_namespaced_job(namespace, job)
    time.sleep(1)
    assert job_pods(core, namespace, "queued") == []

    batch.patch_namespaced_job("queued", namespace, {"spec": {"suspend": False}})
    (pod,) = until(lambda: job_pods(core, namespace, "queued"), what="the admitted Job's pod")
    wait_for_pod_phase(core, namespace, pod.metadata.name, "Running")

    batch.patch_namespaced_job("queued", namespace, {"spec": {"suspend": True}})
    until(lambda: not job_pods(core, namespace, "queued"), what="the suspended Job's pod to go")

    until(lambda: job_condition_is_true(batch, namespace, "queued", "Suspended"), what="condition Suspended")


def test_finished_job_is_removed_after_its_ttl(kube_cluster, namespace):
    batch = client.BatchV1Api(kube_cluster.api_client)
    core = kube_cluster.core_v1
    job = gpu_job("short-lived", gpus=1)
    job["spec"]["ttlSecondsAfterFinished"] = 0
    batch.create_namespaced_job(namespace, job)
    (pod,) = until(lambda: job_pods(core, namespace, "short-lived"), what="the Job's pod")
    wait_for_pod_phase(core, namespace, pod.metadata.name, "Running")
    drive_pod_success(core, namespace, pod.metadata.name)
    until(
        lambda: not batch.list_namespaced_job(namespace, field_selector="metadata.name=short-lived").items,
        what="the TTL-after-finished controller to delete the Job",
    )
