"""Runtimes in the cluster: the operator reads the runtime a job names, merges it, validates the
merged spec, keeps the snapshot a gang was made from, and takes a runtime's new generation only at
the next gang restart. Real API server, Job controller and KWOK nodes; no mocks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from colocgrpo_dev.cluster import drive_pod_failure
from colocgrpo_operator.kube.client import KubeApiError
from support.operator_harness import (
    Cluster,
    condition,
    running_pod,
    tiny_job,
    trainer_config_text,
    wait_event,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster

API = "/apis/colocgrpo.io/v1alpha1"


def runtime_path(kind: str, namespace: str, name: str = "") -> str:
    if kind == "ClusterColocGRPORuntime":
        path = f"{API}/clustercolocgrporuntimes"
    else:
        path = f"{API}/namespaces/{namespace}/colocgrporuntimes"
    return f"{path}/{name}" if name else path


def create_runtime(cluster: Cluster, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "colocgrpo.io/v1alpha1", "kind": kind, "metadata": {"name": name}}
    body["spec"] = spec
    return cluster.api.request("POST", runtime_path(kind, namespace), body=body)


def patch_runtime(cluster: Cluster, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return cluster.api.request(
        "PATCH", runtime_path(kind, namespace, name), body=patch, content_type="application/merge-patch+json"
    )


@pytest.fixture
def cluster_runtime(cluster, op_namespace):
    """A ClusterColocGRPORuntime named after the test's namespace (so tests never share one), deleted after."""
    name = f"rt-{op_namespace}"[:63]
    yield name
    try:
        cluster.api.request("DELETE", runtime_path("ClusterColocGRPORuntime", "", name))
    except KubeApiError as error:
        if error.status != 404:
            raise


def pod_template(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    (batch_job,) = wait_for(lambda: cluster.batch_jobs(namespace, job), 30, f"the batch Job of {job}")
    return dict(batch_job["spec"]["template"]["spec"])


def env_of(template: dict[str, Any]) -> dict[str, str]:
    container = next(c for c in template["containers"] if c["name"] == "trainer")
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_runtime_defaults_reach_the_gang_and_the_jobs_own_fields_win(cluster, operator, op_namespace, cluster_runtime):
    ns, name = op_namespace, "merged"
    toleration = {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
    create_runtime(
        cluster,
        "ClusterColocGRPORuntime",
        ns,
        cluster_runtime,
        {
            "template": {
                "image": "registry.example/colocgrpo-trainer:rt",
                "scheduling": {"nodeSelector": {"type": "kwok"}, "tolerations": [toleration]},
                "podTemplate": {"env": [{"name": "FROM_RUNTIME", "value": "1"}, {"name": "SHARED", "value": "rt"}]},
                "runPolicy": {"maxRestarts": 5},
            }
        },
    )
    job = tiny_job(
        name, runtimeRef={"name": cluster_runtime}, podTemplate={"env": [{"name": "SHARED", "value": "job"}]}
    )
    job["spec"].pop("image", None)
    cluster.create_job(ns, job)
    running = wait_phase(cluster, ns, name, "Running", operator=operator)
    assert condition(running, "SpecValid")["status"] == "True"
    assert running["status"]["runtime"] == {"kind": "ClusterColocGRPORuntime", "name": cluster_runtime, "generation": 1}

    template = pod_template(cluster, ns, name)
    assert template["containers"][0]["image"] == "registry.example/colocgrpo-trainer:rt"
    assert template["nodeSelector"] == {"type": "kwok"}
    assert toleration in template["tolerations"]
    env = env_of(template)
    assert env["FROM_RUNTIME"] == "1"
    assert env["SHARED"] == "job"  # the job's own item replaces the runtime's of the same name


def test_a_locked_field_the_job_overrides_is_refused_naming_it(cluster, operator, op_namespace, cluster_runtime):
    ns, name = op_namespace, "locked"
    create_runtime(
        cluster,
        "ClusterColocGRPORuntime",
        ns,
        cluster_runtime,
        {"template": {"image": "registry.example/colocgrpo-trainer:rt"}, "lockedFields": ["image"]},
    )
    cluster.create_job(ns, tiny_job(name, runtimeRef={"name": cluster_runtime}, image="mine.example/trainer:1"))
    refused = wait_for(
        lambda: (obj := cluster.get_job(ns, name)) and condition(obj, "SpecValid").get("status") == "False" and obj,
        30,
        "SpecValid=False",
    )
    spec_valid = condition(refused, "SpecValid")
    assert spec_valid["reason"] == "InvalidSpec"
    assert "spec.image" in spec_valid["message"] and "locked" in spec_valid["message"]
    assert f"ClusterColocGRPORuntime {cluster_runtime}" in spec_valid["message"]
    assert cluster.batch_jobs(ns, name) == []


def test_a_missing_runtime_is_named_and_the_job_starts_once_it_exists(cluster, operator, op_namespace):
    ns, name = op_namespace, "waits"
    cluster.create_job(ns, tiny_job(name, runtimeRef={"kind": "ColocGRPORuntime", "name": "later"}))
    waiting = wait_for(
        lambda: (obj := cluster.get_job(ns, name)) and condition(obj, "SpecValid").get("status") == "False" and obj,
        30,
        "SpecValid=False",
    )
    spec_valid = condition(waiting, "SpecValid")
    assert spec_valid["reason"] == "RuntimeNotFound"
    assert waiting["status"]["phase"] == "Pending" and condition(waiting, "Failed")["status"] == "False"
    assert spec_valid["message"].startswith(f"spec.runtimeRef: ColocGRPORuntime {ns}/later not found")
    assert cluster.batch_jobs(ns, name) == []

    create_runtime(cluster, "ColocGRPORuntime", ns, "later", {"template": {"image": "registry.example/t:later"}})
    running = wait_phase(cluster, ns, name, "Running", timeout=45, operator=operator)
    assert condition(running, "SpecValid")["status"] == "True"
    assert running["status"]["runtime"] == {"kind": "ColocGRPORuntime", "name": "later", "generation": 1}
    assert pod_template(cluster, ns, name)["containers"][0]["image"] == "registry.example/t:later"


def test_a_runtime_edited_mid_job_reaches_only_the_next_gang(
    cluster, kube_cluster, operator, op_namespace, cluster_runtime
):
    ns, name = op_namespace, "edited"
    create_runtime(
        cluster,
        "ClusterColocGRPORuntime",
        ns,
        cluster_runtime,
        {"template": {"podTemplate": {"env": [{"name": "RUNTIME_VERSION", "value": "1"}]}}},
    )
    cluster.create_job(ns, tiny_job(name, runtimeRef={"name": cluster_runtime}, runPolicy={"maxRestarts": 2}))
    first = running_pod(cluster, ns, name)
    (first_job,) = cluster.batch_jobs(ns, name)
    config = trainer_config_text(cluster, ns, name)

    edited = patch_runtime(
        cluster,
        "ClusterColocGRPORuntime",
        ns,
        cluster_runtime,
        {"spec": {"template": {"podTemplate": {"env": [{"name": "RUNTIME_VERSION", "value": "2"}]}}}},
    )
    assert edited["metadata"]["generation"] == 2
    # A change of the job's labels makes the operator reconcile it and apply its children again;
    # kopf records the labels it handled in the job's diff-base once that reconcile succeeded.
    cluster.patch_job(ns, name, {"metadata": {"labels": {"touched": "after-the-edit"}}})
    wait_for(
        lambda: any(
            "after-the-edit" in str(value) and key.endswith("last-handled-configuration")
            for key, value in ((cluster.get_job(ns, name) or {}).get("metadata", {}).get("annotations") or {}).items()
        ),
        30,
        "the operator to handle the job's change",
    )
    obj = cluster.get_job(ns, name)
    assert obj["status"]["runtime"]["generation"] == 1
    (same_job,) = cluster.batch_jobs(ns, name)
    assert same_job["metadata"]["uid"] == first_job["metadata"]["uid"]
    assert env_of(same_job["spec"]["template"]["spec"])["RUNTIME_VERSION"] == "1"
    assert trainer_config_text(cluster, ns, name) == config

    # The next gang is made from the runtime's new generation, and says so.
    drive_pod_failure(kube_cluster.core_v1, ns, first["metadata"]["name"], exit_code=1)
    running_pod(cluster, ns, name, exclude_uid=first["metadata"]["uid"], timeout=45)
    (second_job,) = wait_for(
        lambda: [j for j in cluster.batch_jobs(ns, name) if j["metadata"]["uid"] != first_job["metadata"]["uid"]],
        30,
        "the second gang's batch Job",
    )
    assert env_of(second_job["spec"]["template"]["spec"])["RUNTIME_VERSION"] == "2"
    restarted = wait_for(
        lambda: (o := cluster.get_job(ns, name)) and (o["status"].get("runtime") or {}).get("generation") == 2 and o,
        30,
        "status.runtime generation 2",
    )
    assert restarted["status"]["restarts"] == 1
    wait_event(cluster, ns, "RuntimeUpdated", f"{cluster_runtime} generation 2", timeout=30)
    # The record keeps the snapshot the gang was made from.
    record = json.loads(restarted["metadata"]["annotations"]["colocgrpo.io/record"])
    assert record["runtime"]["generation"] == 2
