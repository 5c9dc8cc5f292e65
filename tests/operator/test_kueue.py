"""The operator against real Kueue (its manager built from the Go module, colocgrpo_dev/cluster/build/build-kueue.sh):
quota, queueing, priority, preemption, suspension and deletion, on the fake 8-GPU nodes.

Each test gets a namespace with a LocalQueue `gpu` over a ClusterQueue of its own holding 8 GPUs
of quota (conftest.py), so one 8-GPU job fits and a second one waits.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success
from colocgrpo_dev.cluster.kueue import MANAGED_NAMESPACE_LABEL
from support.operator_harness import OperatorProcess, condition, kueue_queues, tiny_job, wait_for

pytestmark = pytest.mark.cluster

GPU_JOB = {"nodes": 1, "gpusPerNode": 8, "cpu": "1", "memory": "1Gi"}
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def gpu_job(name, priority_class=None, **scheduling):
    """A job of 8 GPUs for the LocalQueue `gpu`, named the way Kueue's users name it: a label on the job."""
    body = tiny_job(name, resources=GPU_JOB, **({"scheduling": scheduling} if scheduling else {}))
    body["metadata"]["labels"] = {QUEUE_LABEL: "gpu", **({PRIORITY_LABEL: priority_class} if priority_class else {})}
    return body


def status_of(cluster, ns, name):
    return (cluster.get_job(ns, name) or {}).get("status") or {}


def wait_phase(cluster, operator, kueue, ns, name, wanted, timeout=60, why=None):
    """Wait for phase `wanted` (and, with `why`, a Queued condition whose reason is `why`)."""

    def reached():
        obj = cluster.get_job(ns, name)
        if (obj or {}).get("status", {}).get("phase") != wanted:
            return None
        if why is not None and condition(obj, "Queued").get("reason") != why:
            return None
        return obj

    return wait_for(
        reached,
        timeout,
        f"{ns}/{name} phase {wanted}" + (f" ({why})" if why else ""),
        on_timeout=lambda: (
            f"status: {status_of(cluster, ns, name)}\nworkloads: {json.dumps(workloads(cluster, ns))}\n"
            f"--- operator ---\n{operator.log_tail(30)}\n--- kueue ---\n{kueue.log_tail(6)}"
        ),
    )


def workloads(cluster, ns):
    return cluster.list(KUEUE, "workloads", ns)


def workload_of(cluster, ns, name):
    """The Workload Kueue made for the job's current batch Job (None before it exists)."""
    jobs = cluster.batch_jobs(ns, name)
    if not jobs:
        return None
    found = cluster.list(KUEUE, "workloads", ns, f"kueue.x-k8s.io/job-uid={jobs[0]['metadata']['uid']}")
    return found[0] if found else None


def running_pod(cluster, ns, name):
    def find():
        return next(
            (
                p
                for p in cluster.pods(ns, name)
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            ),
            None,
        )

    return wait_for(find, 60, f"a running pod of {ns}/{name}")


def finish(cluster, kube_cluster, operator, kueue, ns, name):
    drive_pod_success(kube_cluster.core_v1, ns, running_pod(cluster, ns, name)["metadata"]["name"])
    wait_phase(cluster, operator, kueue, ns, name, "Succeeded")


def job_events(cluster, ns, name, reason):
    return [
        e
        for e in cluster.events(ns)
        if e["involvedObject"].get("kind") == "Job" and e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def kueue_crds(kube_cluster) -> list[str]:
    names = kube_cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    return [name for name in names if name.endswith(".kueue.x-k8s.io")]


def test_an_operator_started_before_kueue_warns_of_nothing_and_serves_it_once_installed(
    cluster, kube_cluster, crd_installed, kueue_leftovers, request, tmp_path
):
    """Without Kueue's CRDs kopf cannot serve the operator's Workload handlers: one INFO line says
    so, no warning at start or on any CRD change after; once Kueue is installed, the same operator
    reads its Workloads (a queued job says why, in Kueue's words) without a restart. First in this
    file, before the session's Kueue is started."""
    if kueue_crds(kube_cluster):
        # Deleting them would strand their instances' finalizers (Kueue's, with Kueue stopped).
        pytest.skip("Kueue's CRDs are installed already: a cluster kept from an earlier session")
    own = OperatorProcess(
        Path(kube_cluster.kubeconfig), ["kqlate-*"], tmp_path / "operator.log", extra_args=("--log-level=DEBUG",)
    )
    ns = None
    try:
        own.start()
        # A CRD change makes kopf look at every handler's resource again.
        kube_cluster.kubectl(
            "annotate", "--overwrite", "crd/colocgrpojobs.colocgrpo.io", f"colocgrpo.dev/touch={uuid.uuid4().hex}"
        )

        def unresolved() -> list[str]:
            return [line for line in own.log_since(0).splitlines() if "Unresolved resources" in line]

        # Seen twice (at start and after the CRD change), at DEBUG where DEBUG is logged.
        wait_for(lambda: len(unresolved()) >= 2, 60, "kopf to look for the Workload CRD twice", on_timeout=own.log_tail)
        assert all(" DEBUG " in line and "kueue.x-k8s.io" in line for line in unresolved()), unresolved()
        said = [line for line in own.log_since(0).splitlines() if "Workload API is not installed" in line]
        assert len(said) == 1 and " INFO " in said[0], said

        kueue = request.getfixturevalue("kueue")
        ns = kube_cluster.new_namespace("kqlate")
        key, value = MANAGED_NAMESPACE_LABEL
        kube_cluster.kubectl("label", "namespace", ns, f"{key}={value}")
        kube_cluster.kubectl("apply", "-f", "-", input="\n".join(json.dumps(q) for q in kueue_queues(ns, ns)))
        cluster.create_job(ns, gpu_job("first"))
        wait_phase(cluster, own, kueue, ns, "first", "Running")
        cluster.create_job(ns, gpu_job("second"))
        queued = wait_phase(cluster, own, kueue, ns, "second", "Queued", why="WaitingForQuota")
        assert workload_of(cluster, ns, "second")["metadata"]["name"] in condition(queued, "Queued")["message"]
        assert not [line for line in own.log_since(0).splitlines() if " WARNING " in line and "Unresolved" in line]
    finally:
        own.stop()
        if ns is not None:
            kube_cluster.kubectl("delete", "namespace", ns, "--wait=false")
            kube_cluster.kubectl("delete", "clusterqueue", ns, "--ignore-not-found", "--wait=false")
            kueue_leftovers += [f"namespace/{ns}", f"clusterqueue/{ns}"]


def test_quota_for_one_job_runs_one_and_queues_the_other_until_it_finishes(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    ns = kueue_namespace
    cluster.create_job(ns, gpu_job("first"))
    wait_phase(cluster, operator, kueue, ns, "first", "Running")
    cluster.create_job(ns, gpu_job("second"))
    queued = wait_phase(cluster, operator, kueue, ns, "second", "Queued", why="WaitingForQuota")

    # Says so and why, in Kueue's words, naming the Workload.
    message = condition(queued, "Queued")["message"]
    assert "insufficient unused quota for nvidia.com/gpu" in message, message
    workload = workload_of(cluster, ns, "second")
    assert workload["metadata"]["name"] in message
    assert queued["status"]["message"].startswith("queued in Kueue queue gpu: ")
    assert condition(queued, "Running")["status"] == "False"
    assert cluster.batch_jobs(ns, "second")[0]["spec"]["suspend"] is True
    assert cluster.pods(ns, "second") == []
    assert condition(cluster.get_job(ns, "first"), "Queued")["status"] == "False"

    finish(cluster, kube_cluster, operator, kueue, ns, "first")
    admitted = wait_phase(cluster, operator, kueue, ns, "second", "Running")
    assert condition(admitted, "Queued")["status"] == "False"
    assert condition(admitted, "Queued")["reason"] == "NotQueued"
    admission = workload_of(cluster, ns, "second")["status"]["admission"]
    assert admission["clusterQueue"] == ns


@pytest.mark.parametrize("kueue_namespace", [{"queueingStrategy": "StrictFIFO"}], indirect=True)
def test_a_gang_restart_queues_again_behind_waiting_jobs_and_says_so(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    """Kueue's Workload belongs to the batch Job; a gang restart replaces the Job, so the new Workload
    queues from the back: with StrictFIFO a job already waiting takes the quota first. (With
    BestEffortFIFO, Kueue's default, it is a race: a waiting Workload Kueue found inadmissible is
    only requeued a moment after quota frees up, and the restarted gang's new one may get in first.)"""
    ns = kueue_namespace
    cluster.create_job(
        ns,
        gpu_job(
            "flaky",
        ),
    )
    pod = running_pod(cluster, ns, "flaky")
    first_workload = workload_of(cluster, ns, "flaky")["metadata"]["name"]
    cluster.create_job(ns, gpu_job("waiting"))
    wait_phase(cluster, operator, kueue, ns, "waiting", "Queued", why="WaitingForQuota")

    before, mark = operator.gang_restarts(), operator.log_mark()
    drive_pod_failure(kube_cluster.core_v1, ns, pod["metadata"]["name"], exit_code=1, message="boom")
    wait_phase(cluster, operator, kueue, ns, "waiting", "Running")
    requeued = wait_phase(cluster, operator, kueue, ns, "flaky", "Queued", why="WaitingForQuota")
    assert requeued["status"]["restarts"] == 1
    # Counted once: the Workload's events make a second reconcile likely to see the failed Job.
    assert operator.gang_restarts() - before == 1
    restarts = [line for line in operator.log_since(mark).splitlines() if f"{ns}/flaky: gang restart after" in line]
    assert len(restarts) == 1, restarts
    assert requeued["status"]["message"].startswith("queued again after the gang restart in Kueue queue gpu: ")
    assert workload_of(cluster, ns, "flaky")["metadata"]["name"] != first_workload

    finish(cluster, kube_cluster, operator, kueue, ns, "waiting")
    back = wait_phase(cluster, operator, kueue, ns, "flaky", "Running")
    assert back["status"]["restarts"] == 1


def test_workload_priority_class_reaches_the_workload_and_orders_the_queue(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    ns = kueue_namespace
    priority_class = f"{ns}-high"
    kube_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class},
                "value": 1000,
            }
        ),
    )
    try:
        cluster.create_job(ns, gpu_job("running"))
        wait_phase(cluster, operator, kueue, ns, "running", "Running")
        cluster.create_job(ns, gpu_job("early"))
        wait_phase(cluster, operator, kueue, ns, "early", "Queued", why="WaitingForQuota")
        cluster.create_job(ns, gpu_job("urgent", priority_class=priority_class))
        wait_phase(cluster, operator, kueue, ns, "urgent", "Queued", why="WaitingForQuota")

        assert cluster.batch_jobs(ns, "urgent")[0]["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == (
            priority_class
        )
        spec = workload_of(cluster, ns, "urgent")["spec"]
        assert spec["priorityClassRef"]["name"] == priority_class
        assert spec["priorityClassRef"]["kind"] == "WorkloadPriorityClass"
        assert spec["priority"] == 1000
        assert workload_of(cluster, ns, "early")["spec"].get("priority", 0) == 0

        # The later, higher-priority job is admitted first.
        finish(cluster, kube_cluster, operator, kueue, ns, "running")
        wait_phase(cluster, operator, kueue, ns, "urgent", "Running")
        assert status_of(cluster, ns, "early")["phase"] == "Queued"
    finally:
        kube_cluster.kubectl("delete", "workloadpriorityclass", priority_class, "--ignore-not-found")


@pytest.mark.parametrize("kueue_namespace", [{"preemption": {"withinClusterQueue": "LowerPriority"}}], indirect=True)
def test_suspension_by_the_user_and_by_kueue_never_fight(cluster, kube_cluster, operator, kueue, kueue_namespace):
    """Kueue starts any suspended Job whose Workload is admitted, so the user's suspend deletes the
    Job (quota released, nothing for Kueue to restart); Kueue's own suspension (preemption) is
    never undone by the operator."""
    ns = kueue_namespace
    cluster.create_job(ns, gpu_job("paused"))
    wait_phase(cluster, operator, kueue, ns, "paused", "Running")
    cluster.patch_job(ns, "paused", {"spec": {"runPolicy": {"suspend": True}}})
    suspended = wait_phase(cluster, operator, kueue, ns, "paused", "Suspended")
    assert condition(suspended, "Suspended")["status"] == "True"
    assert "Kueue releases its quota" in suspended["status"]["message"]

    # The quota is free: another job is admitted, and the suspended one got no Job back meanwhile.
    cluster.create_job(ns, gpu_job("victim"))
    wait_phase(cluster, operator, kueue, ns, "victim", "Running")
    assert cluster.batch_jobs(ns, "paused") == []
    assert [w["metadata"]["name"] for w in workloads(cluster, ns)] == [
        workload_of(cluster, ns, "victim")["metadata"]["name"]
    ]
    assert status_of(cluster, ns, "paused")["phase"] == "Suspended"

    # Resumed, it queues like any new job.
    cluster.patch_job(ns, "paused", {"spec": {"runPolicy": {"suspend": False}}})
    wait_phase(cluster, operator, kueue, ns, "paused", "Queued", why="WaitingForQuota")

    # Kueue preempts `victim` for a higher-priority job: it suspends victim's Job, which the
    # operator shows as queued again (evicted) and leaves suspended.
    priority_class = f"{ns}-high"
    kube_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class},
                "value": 1000,
            }
        ),
    )
    try:
        cluster.create_job(ns, gpu_job("vip", priority_class=priority_class))
        wait_phase(cluster, operator, kueue, ns, "vip", "Running")
        evicted = wait_phase(cluster, operator, kueue, ns, "victim", "Queued", why="Evicted")
        assert "evicted (Preempted)" in condition(evicted, "Queued")["message"]
        assert evicted["status"]["message"].startswith("queued again in Kueue queue gpu: ")
        assert evicted["status"].get("restarts", 0) == 0  # a preemption is no failure
        assert cluster.batch_jobs(ns, "victim")[0]["spec"]["suspend"] is True
        # Kueue started victim's Job once and stopped it once: nobody restarted it behind its back.
        assert len(job_events(cluster, ns, "victim", "Started")) == 1
        assert status_of(cluster, ns, "paused")["phase"] == "Queued"

        # A queued job suspended by the user is never admitted: it has no Job.
        cluster.patch_job(ns, "paused", {"spec": {"runPolicy": {"suspend": True}}})
        wait_phase(cluster, operator, kueue, ns, "paused", "Suspended")
        wait_for(lambda: not cluster.batch_jobs(ns, "paused"), 60, "the suspended job's Job to go")
        finish(cluster, kube_cluster, operator, kueue, ns, "vip")
        wait_phase(cluster, operator, kueue, ns, "victim", "Running")
        assert status_of(cluster, ns, "paused")["phase"] == "Suspended"
        assert cluster.batch_jobs(ns, "paused") == []
    finally:
        kube_cluster.kubectl("delete", "workloadpriorityclass", priority_class, "--ignore-not-found")


def test_deleting_a_queued_job_leaves_nothing_behind(cluster, kube_cluster, operator, kueue, kueue_namespace):
    ns = kueue_namespace
    cluster.create_job(ns, gpu_job("holder"))
    wait_phase(cluster, operator, kueue, ns, "holder", "Running")
    cluster.create_job(ns, gpu_job("doomed"))
    wait_phase(cluster, operator, kueue, ns, "doomed", "Queued", why="WaitingForQuota")
    doomed_workload = workload_of(cluster, ns, "doomed")["metadata"]["name"]

    cluster.delete_job(ns, "doomed")

    def gone():
        names = [w["metadata"]["name"] for w in workloads(cluster, ns)]
        return (
            cluster.get_job(ns, "doomed") is None
            and not cluster.batch_jobs(ns, "doomed")
            and not cluster.pods(ns, "doomed")
            and doomed_workload not in names
            and not cluster.list("/api/v1", "configmaps", ns, "colocgrpo.io/job-name=doomed")
        )

    wait_for(gone, 60, "the deleted job's Job, Workload, pods and children to go")
    cq = cluster.api.request("GET", f"{KUEUE}/clusterqueues/{ns}")
    wait_for(
        lambda: (
            (cluster.api.request("GET", f"{KUEUE}/clusterqueues/{ns}").get("status") or {}).get("pendingWorkloads") == 0
        ),
        30,
        f"no pending Workload in ClusterQueue {ns}",
        on_timeout=lambda: str(cq.get("status")),
    )
    assert status_of(cluster, ns, "holder")["phase"] == "Running"


def test_kueues_default_local_queue_takes_a_job_without_queue_name(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    """With a LocalQueue named `default`, Kueue's webhook labels and suspends every Job created
    without a queue name: the operator treats such a Job as Kueue's (never resumes it)."""
    ns = kueue_namespace
    kube_cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "default", "namespace": ns},
                "spec": {"clusterQueue": ns},
            }
        ),
    )
    cluster.create_job(ns, gpu_job("labelled"))
    wait_phase(cluster, operator, kueue, ns, "labelled", "Running")
    cluster.create_job(ns, tiny_job("unlabelled", resources=GPU_JOB))
    queued = wait_phase(cluster, operator, kueue, ns, "unlabelled", "Queued", why="WaitingForQuota")
    assert queued["status"]["message"].startswith("queued in Kueue queue default: ")
    job = cluster.batch_jobs(ns, "unlabelled")[0]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    assert job["spec"]["suspend"] is True
    assert job_events(cluster, ns, "unlabelled", "Resumed") == []

    finish(cluster, kube_cluster, operator, kueue, ns, "labelled")
    wait_phase(cluster, operator, kueue, ns, "unlabelled", "Running")


def test_the_deprecated_queue_field_still_queues_and_is_warned_of_a_conflict_refused(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    """spec.scheduling.queueName is a deprecated alias of the label: the API server warns (the policy of
    api/queueing.py), the operator posts a Warning Event, and the job queues like a labelled one. A label and
    field that disagree are refused by the API server, naming both."""
    ns = kueue_namespace
    cluster.create_job(ns, gpu_job("holder"))
    wait_phase(cluster, operator, kueue, ns, "holder", "Running")
    old_style = tiny_job("old-style", resources=GPU_JOB, scheduling={"queueName": "gpu"})
    applied = kube_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(old_style))
    assert applied.stderr.startswith("Warning: "), applied.stderr
    assert "spec.scheduling.queueName: deprecated: put the label kueue.x-k8s.io/queue-name" in applied.stderr
    wait_phase(cluster, operator, kueue, ns, "old-style", "Queued", why="WaitingForQuota")
    assert cluster.batch_jobs(ns, "old-style")[0]["metadata"]["labels"][QUEUE_LABEL] == "gpu"
    warned = wait_for(
        lambda: [
            e
            for e in cluster.events(ns)
            if e["involvedObject"].get("kind") == "ColocGRPOJob"
            and e["involvedObject"]["name"] == "old-style"
            and e["reason"] == "DeprecatedField"
        ],
        60,
        "the operator's DeprecatedField Event",
    )
    assert warned[0]["type"] == "Warning"
    assert warned[0]["message"].startswith("spec.scheduling.queueName: deprecated")

    conflicting = gpu_job("conflicting", queueName="other")
    refused = kube_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(conflicting), check=False)
    assert refused.returncode != 0
    assert "the label kueue.x-k8s.io/queue-name and spec.scheduling.queueName name different values" in (
        refused.stderr
    ), refused.stderr
    assert cluster.get_job(ns, "conflicting") is None


def test_with_manage_jobs_without_queue_name_a_job_naming_no_queue_waits_and_says_why(
    cluster, kube_cluster, operator, kueue, kueue_namespace
):
    """Kueue configured with manageJobsWithoutQueueName: true suspends every Job of the namespaces it manages,
    queue name or not. The operator never fights it (no resume), and the job says what to do; a job with the
    label runs as before. Last in this file: it restarts the session's Kueue with that setting, then without."""
    ns = kueue_namespace
    kueue.stop()
    kueue.manage_jobs_without_queue_name = True
    try:
        kueue.start()
        mark = operator.log_mark()
        cluster.create_job(ns, tiny_job("nameless", resources=GPU_JOB))
        queued = wait_phase(cluster, operator, kueue, ns, "nameless", "Queued", why="NoQueueName")
        message = condition(queued, "Queued")["message"]
        assert "manageJobsWithoutQueueName" in message and "kueue.x-k8s.io/queue-name=<LocalQueue>" in message
        (job,) = cluster.batch_jobs(ns, "nameless")
        assert job["spec"]["suspend"] is True
        assert QUEUE_LABEL not in job["metadata"]["labels"]
        # Kueue's own word once its Workload exists: the LocalQueue "" does not exist.
        wait_for(
            lambda: "doesn't exist" in condition(cluster.get_job(ns, "nameless"), "Queued")["message"],
            60,
            "Kueue's reason in the Queued condition",
            on_timeout=lambda: json.dumps(workloads(cluster, ns)),
        )

        cluster.create_job(ns, gpu_job("named"))
        wait_phase(cluster, operator, kueue, ns, "named", "Running")
        # The operator never resumed the nameless one: Kueue suspended it at creation and it stayed so.
        (job,) = cluster.batch_jobs(ns, "nameless")
        assert job["spec"]["suspend"] is True
        assert job["metadata"]["annotations"]["colocgrpo.io/suspend-requested"] == "false"
        assert job_events(cluster, ns, "nameless", "Resumed") == []
        assert cluster.pods(ns, "nameless") == []
        assert not [line for line in operator.log_since(mark).splitlines() if "Traceback" in line]
    finally:
        kueue.stop()
        kueue.manage_jobs_without_queue_name = False
        kueue.start()
