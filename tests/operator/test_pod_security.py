"""Trainer pods under Pod Security admission on the real apiserver.

PodSecurity admission runs in the apiserver, before any kubelet (here KWOK) sees a pod: a namespace labelled
`pod-security.kubernetes.io/enforce=restricted` refuses every pod that does not meet the level.
"""

from __future__ import annotations

import pytest

from colocgrpo_dev.cluster import drive_pod_success
from support.operator_harness import condition, tiny_job, wait_for

pytestmark = pytest.mark.cluster

BASELINE = {"podSecurity": {"level": "baseline"}}


def _enforce(kube_cluster, namespace: str, level: str) -> None:
    kube_cluster.kubectl(
        "label",
        "--overwrite",
        "namespace",
        namespace,
        f"pod-security.kubernetes.io/enforce={level}",
        "pod-security.kubernetes.io/enforce-version=latest",
    )


def _job_phase(cluster, namespace: str, name: str, wanted: str, operator, timeout: float = 60) -> dict:
    return wait_for(
        lambda: (obj := cluster.get_job(namespace, name)) and (obj.get("status") or {}).get("phase") == wanted and obj,
        timeout,
        f"{namespace}/{name} {wanted}",
        on_timeout=lambda: f"status: {(cluster.get_job(namespace, name) or {}).get('status')}\n{operator.log_tail()}",
    )


def _pod_security_refusals(cluster, namespace: str, job: str) -> list[str]:
    return [
        event.get("message") or ""
        for event in cluster.events(namespace)
        if event.get("reason") == "FailedCreate"
        and (event.get("involvedObject") or {}).get("name") == job
        and "violates PodSecurity" in (event.get("message") or "")
    ]


def test_default_trainer_pods_pass_the_restricted_level(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    _enforce(kube_cluster, ns, "restricted")

    # The label is enforced: the same job opted out to baseline gets no pod, and the Job controller says why.
    cluster.create_job(ns, tiny_job("rooted", podTemplate=BASELINE))
    refusals = wait_for(
        lambda: _pod_security_refusals(cluster, ns, "rooted"),
        60,
        "the baseline job's pod to be refused",
        on_timeout=operator.log_tail,
    )
    assert "restricted:latest" in refusals[0] and "runAsNonRoot" in refusals[0], refusals
    assert cluster.pods(ns, "rooted") == []

    # The default job is admitted, runs and succeeds.
    cluster.create_job(ns, tiny_job("locked"))
    running = _job_phase(cluster, ns, "locked", "Running", operator)
    (pod,) = cluster.pods(ns, "locked")
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000 and security["runAsGroup"] == 1000
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    drive_pod_success(kube_cluster.core_v1, ns, running["status"]["rank0Pod"])
    _job_phase(cluster, ns, "locked", "Succeeded", operator)
    assert _pod_security_refusals(cluster, ns, "locked") == []


def _running(cluster, namespace: str, name: str) -> dict:
    return condition(cluster.get_job(namespace, name), "Running")


def _job_events(cluster, namespace: str, name: str, reason: str) -> list[dict]:
    return [
        event
        for event in cluster.events(namespace)
        if event.get("reason") == reason
        and (event.get("involvedObject") or {}).get("kind") == "ColocGRPOJob"
        and (event.get("involvedObject") or {}).get("name") == name
    ]


def test_a_refused_pod_is_reported_and_the_job_recovers_once_admitted(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    _enforce(kube_cluster, ns, "restricted")
    cluster.create_job(ns, tiny_job("rooted", podTemplate=BASELINE))

    # The Job controller's refusal reaches the job's status, in the API server's words.
    refused = wait_for(
        lambda: (running := _running(cluster, ns, "rooted")).get("reason") == "PodCreationFailed" and running,
        60,
        "the Running condition to say PodCreationFailed",
        on_timeout=lambda: f"{(cluster.get_job(ns, 'rooted') or {}).get('status')}\n{operator.log_tail()}",
    )
    assert refused["status"] == "False"
    assert "violates PodSecurity" in refused["message"] and "restricted:latest" in refused["message"], refused
    assert refused["message"].startswith("0/1 workers created; the Job controller cannot create the others: ")
    status = cluster.get_job(ns, "rooted")["status"]
    assert status["phase"] == "Starting" and "violates PodSecurity" in status["message"]  # it can recover
    assert condition(cluster.get_job(ns, "rooted"), "Failed")["status"] == "False"
    wide = kube_cluster.kubectl("get", "colocgrpojobs", "rooted", "-n", ns, "-o", "wide", "--no-headers").stdout
    assert "PodCreationFailed" in wide.split() and "Starting" in wide.split(), wide
    warning = wait_for(
        lambda: _job_events(cluster, ns, "rooted", "PodCreationFailed"), 30, "a PodCreationFailed Event on the job"
    )
    assert warning[0]["type"] == "Warning" and "violates PodSecurity" in warning[0]["message"]
    assert cluster.pods(ns, "rooted") == []

    # Once the namespace admits baseline pods, the Job controller's next retry creates the pod (its backoff
    # doubles from 1 s to at most 60 s) and the job runs.
    _enforce(kube_cluster, ns, "baseline")
    running = _job_phase(cluster, ns, "rooted", "Running", operator, timeout=120)
    assert condition(running, "Running")["reason"] == "AllWorkersRunning"
    assert "cannot create" not in running["status"]["message"]
    # Announced once, though the refusal stood through many re-checks.
    assert len(_job_events(cluster, ns, "rooted", "PodCreationFailed")) == 1
    drive_pod_success(kube_cluster.core_v1, ns, running["status"]["rank0Pod"])
    _job_phase(cluster, ns, "rooted", "Succeeded", operator)


def test_baseline_opt_out_runs_where_the_namespace_admits_baseline(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    _enforce(kube_cluster, ns, "baseline")
    cluster.create_job(ns, tiny_job("rooted", podTemplate=BASELINE))
    running = _job_phase(cluster, ns, "rooted", "Running", operator)
    (pod,) = cluster.pods(ns, "rooted")
    # The image's own USER applies: the operator forces no uid and no container security context.
    assert "runAsUser" not in pod["spec"]["securityContext"]
    assert "runAsNonRoot" not in pod["spec"]["securityContext"]
    assert "securityContext" not in pod["spec"]["containers"][0]
    drive_pod_success(kube_cluster.core_v1, ns, running["status"]["rank0Pod"])
    _job_phase(cluster, ns, "rooted", "Succeeded", operator)
