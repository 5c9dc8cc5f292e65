"""The operator against the real local control plane: real apiserver, controller-manager
(Job controller, garbage collector), scheduler and KWOK fake nodes. No mocks."""

from __future__ import annotations

import concurrent.futures
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz import set_path
from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success, evict_pod
from colocgrpo_operator.kube.client import KubeApiError
from support.operator_harness import (
    OperatorProcess,
    condition,
    phase,
    running_pod,
    tiny_job,
    trainer_config_text,
    wait_event,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def test_lifecycle_to_succeeded(cluster, kube_cluster, operator, op_namespace):
    ns, name = op_namespace, "life"
    cluster.create_job(ns, tiny_job(name))
    running = wait_phase(cluster, ns, name, "Running", operator=operator)
    status = running["status"]
    assert condition(running, "SpecValid")["status"] == "True"
    assert condition(running, "Running")["status"] == "True"
    assert status["workers"]["active"] == 1
    assert status["rank0Pod"].startswith(f"{name}-0-")
    assert status["observedGeneration"] == running["metadata"]["generation"]
    assert status.get("startTime")

    # Every child exists, labelled, and owned by the job (so deletion cascades). One node: no Service.
    uid = running["metadata"]["uid"]
    assert cluster.list("/api/v1", "services", ns, f"colocgrpo.io/job-name={name}") == []
    for prefix, plural, child in [
        ("/api/v1", "configmaps", f"{name}-config"),
        ("/api/v1", "serviceaccounts", f"{name}-trainer"),
        ("/apis/rbac.authorization.k8s.io/v1", "roles", f"{name}-trainer"),
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", f"{name}-trainer"),
        ("/apis/batch/v1", "jobs", name),
    ]:
        obj = cluster.api.request("GET", f"{prefix}/namespaces/{ns}/{plural}/{child}")
        owners = obj["metadata"].get("ownerReferences") or []
        assert [o["uid"] for o in owners] == [uid], f"{plural}/{child} owners {owners}"

    # The trainer's progress (written through the status subresource) is never overwritten.
    progress = {"step": 1, "maxSteps": 2, "metrics": {"reward": 0.5}, "lastUpdateTime": "2026-01-01T00:00:00Z"}
    cluster.patch_job(ns, name, {"status": {"progress": progress}}, subresource="status")
    drive_pod_success(kube_cluster.core_v1, ns, status["rank0Pod"])
    done = wait_phase(cluster, ns, name, "Succeeded", operator=operator)
    assert condition(done, "Succeeded")["status"] == "True"
    assert condition(done, "Failed")["status"] == "False"
    assert done["status"].get("completionTime")
    assert done["status"]["progress"] == progress

    # kopf posts Events from a queue of its own, after the status write: wait for them, do not race them.
    def job_event_reasons() -> set[str]:
        return {
            e.get("reason") for e in cluster.events(ns) if (e.get("involvedObject") or {}).get("kind") == "ColocGRPOJob"
        }

    wait_for(lambda: {"Running", "Succeeded"} <= job_event_reasons(), 10, "Running and Succeeded Events")
    assert operator.alive()


def test_only_a_gang_across_pods_gets_the_headless_service(cluster, operator, op_namespace):
    """A 1-node job runs without a Service (rank 0 is in its own pod); a 2-node job's pods find
    rank 0 through the headless Service, which the job owns."""
    ns = op_namespace
    cluster.create_job(ns, tiny_job("solo"))
    # Several pods on their own emptyDirs cannot resume together (no claim here).
    cluster.create_job(ns, tiny_job("duo", resources={"nodes": 2}, checkpoint={"resume": "never"}))
    wait_phase(cluster, ns, "solo", "Running", operator=operator)
    duo = wait_phase(cluster, ns, "duo", "Running", operator=operator)
    assert duo["status"]["workers"]["active"] == 2

    assert cluster.list("/api/v1", "services", ns, "colocgrpo.io/job-name=solo") == []
    (solo_pod,) = cluster.pods(ns, "solo")
    assert "subdomain" not in solo_pod["spec"]
    solo_env = {e["name"]: e.get("value") for e in solo_pod["spec"]["containers"][0]["env"]}
    assert solo_env["MASTER_ADDR"] == "127.0.0.1"

    (service,) = cluster.list("/api/v1", "services", ns, "colocgrpo.io/job-name=duo")
    assert service["metadata"]["name"] == "duo"
    assert [o["uid"] for o in service["metadata"]["ownerReferences"]] == [duo["metadata"]["uid"]]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"colocgrpo.io/job-name": "duo"}
    duo_pods = cluster.pods(ns, "duo")
    assert len(duo_pods) == 2
    for pod in duo_pods:
        assert pod["spec"]["subdomain"] == "duo"
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MASTER_ADDR"] == "duo-0.duo"


def test_invalid_spec_is_reported_and_creates_nothing(cluster, operator, op_namespace):
    ns, name = op_namespace, "bad"
    # A reward function of no known form: the API server refuses it, as validate does.
    with pytest.raises(KubeApiError) as refused:
        cluster.create_job(ns, tiny_job(name, rewards=[{"function": "no such reward"}]))
    assert refused.value.status == 422 and "spec.rewards[0].function" in refused.value.message
    # A mount over one the operator makes: the CRD accepts this (no rule spans the paths); the
    # operator's model refuses it.
    clash = {
        "volumes": [{"name": "extra", "emptyDir": {}}],
        "volumeMounts": [{"name": "extra", "mountPath": "/checkpoints"}],
    }
    cluster.create_job(ns, tiny_job(name, podTemplate=clash))
    failed = wait_phase(cluster, ns, name, "Failed", operator=operator)
    spec_valid = condition(failed, "SpecValid")
    assert spec_valid["status"] == "False"
    assert spec_valid["reason"] == "InvalidSpec"
    assert "spec.podTemplate.volumeMounts[0].mountPath" in spec_valid["message"]
    assert condition(failed, "Failed")["reason"] == "InvalidSpec"
    assert failed["status"]["workers"]["gpus"] == 0  # the GPUs printer column reads 0, not blank
    time.sleep(1)
    assert cluster.batch_jobs(ns, name) == []
    assert cluster.list("/api/v1", "configmaps", ns, f"colocgrpo.io/job-name={name}") == []
    wait_event(cluster, ns, "Failed", "spec.podTemplate.volumeMounts[0].mountPath", 10)

    # Fixing the spec revives the job.
    cluster.patch_job(ns, name, {"spec": {"podTemplate": {"volumeMounts": [{"name": "extra", "mountPath": "/extra"}]}}})
    wait_phase(cluster, ns, name, "Running", operator=operator)


def test_unschedulable_within_seconds(cluster, operator, op_namespace):
    ns, name = op_namespace, "huge"
    started = time.monotonic()
    cluster.create_job(ns, tiny_job(name, resources={"gpusPerNode": 16, "cpu": "1", "memory": "1Gi"}))

    def unschedulable():
        obj = cluster.get_job(ns, name)
        running = condition(obj, "Running")
        return running.get("reason") == "Unschedulable" and obj

    obj = wait_for(unschedulable, 20, "Running=False/Unschedulable", on_timeout=lambda: str(cluster.get_job(ns, name)))
    assert time.monotonic() - started < 20
    assert obj["status"]["phase"] == "Starting"
    assert "nvidia.com/gpu" in condition(obj, "Running")["message"]


def test_failures_restart_the_gang_then_fail(cluster, kube_cluster, operator, op_namespace):
    ns, name = op_namespace, "flaky"
    cluster.create_job(ns, tiny_job(name, runPolicy={"maxRestarts": 1}))
    first = running_pod(cluster, ns, name)
    first_job_uid = cluster.batch_jobs(ns, name)[0]["metadata"]["uid"]
    drive_pod_failure(
        kube_cluster.core_v1,
        ns,
        first["metadata"]["name"],
        exit_code=1,
        message='{"reason": "CUDAOutOfMemory", "message": "tried to allocate 20 GiB"}',
    )

    second = running_pod(cluster, ns, name, exclude_uid=first["metadata"]["uid"], timeout=45)
    jobs = cluster.batch_jobs(ns, name)
    assert len(jobs) == 1 and jobs[0]["metadata"]["uid"] != first_job_uid
    obj = cluster.get_job(ns, name)
    assert obj["status"]["restarts"] == 1
    assert obj["status"]["lastFailure"]["reason"] == "CUDAOutOfMemory"

    drive_pod_failure(kube_cluster.core_v1, ns, second["metadata"]["name"], exit_code=137, reason="OOMKilled")
    failed = wait_phase(cluster, ns, name, "Failed", timeout=30, operator=operator)
    assert condition(failed, "Failed")["reason"] == "MaxRestartsExceeded"
    assert condition(failed, "Running")["reason"] == "OOMKilled"
    assert failed["status"]["restarts"] == 1
    time.sleep(2)  # a failed job stays failed: no third gang
    assert len(cluster.batch_jobs(ns, name)) == 1
    assert phase(cluster, ns, name) == "Failed"


def test_eviction_restarts_without_counting(cluster, kube_cluster, operator, op_namespace):
    ns, name = op_namespace, "evicted"
    cluster.create_job(ns, tiny_job(name, runPolicy={"maxRestarts": 0}))
    first = running_pod(cluster, ns, name)
    evict_pod(kube_cluster.core_v1, ns, first["metadata"]["name"])
    running_pod(cluster, ns, name, exclude_uid=first["metadata"]["uid"], timeout=45)
    obj = wait_phase(cluster, ns, name, "Running", operator=operator)
    assert obj["status"]["restarts"] == 0
    assert obj["status"]["disruptions"] == 1
    assert obj["status"]["lastFailure"]["counted"] is False


def test_suspend_and_resume(cluster, operator, op_namespace):
    ns, name = op_namespace, "pausable"
    cluster.create_job(ns, tiny_job(name))
    first = running_pod(cluster, ns, name)
    cluster.patch_job(ns, name, {"spec": {"runPolicy": {"suspend": True}}})
    suspended = wait_phase(cluster, ns, name, "Suspended", operator=operator)
    assert condition(suspended, "Suspended")["status"] == "True"
    assert cluster.batch_jobs(ns, name)[0]["spec"]["suspend"] is True
    wait_for(
        lambda: not [p for p in cluster.pods(ns, name) if not p["metadata"].get("deletionTimestamp")],
        30,
        "the suspended job's pods to go",
    )
    cluster.patch_job(ns, name, {"spec": {"runPolicy": {"suspend": False}}})
    running_pod(cluster, ns, name, exclude_uid=first["metadata"]["uid"])
    resumed = wait_phase(cluster, ns, name, "Running", operator=operator)
    assert condition(resumed, "Suspended")["status"] == "False"
    assert resumed["status"]["restarts"] == 0


def test_active_deadline(cluster, operator, op_namespace):
    ns, name = op_namespace, "deadline"
    cluster.create_job(ns, tiny_job(name, runPolicy={"activeDeadlineSeconds": 3}))
    failed = wait_phase(cluster, ns, name, "Failed", timeout=40, operator=operator)
    assert condition(failed, "Failed")["reason"] == "DeadlineExceeded"


def test_stalled_when_progress_stops(cluster, operator, op_namespace):
    ns, name = op_namespace, "stuck"
    cluster.create_job(ns, tiny_job(name, runPolicy={"stallTimeoutSeconds": 3}))
    wait_phase(cluster, ns, name, "Running", operator=operator)
    stalled = wait_for(
        lambda: condition(cluster.get_job(ns, name), "Stalled").get("status") == "True" and cluster.get_job(ns, name),
        20,
        "Stalled=True",
    )
    assert condition(stalled, "Stalled")["reason"] == "Stalled"
    # Progress moves again, as a live trainer reports it: a fresh step while we wait. One report alone
    # unstalls the job only for the 3 s stall window after its time, which a loaded machine's
    # reconcile can miss; a trainer that keeps reporting keeps it unstalled.
    steps = iter(range(1, 10_000))

    def report_and_look() -> dict | None:
        now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        progress = {"step": next(steps), "lastUpdateTime": now}
        cluster.patch_job(ns, name, {"status": {"progress": progress}}, subresource="status")
        seen = condition(cluster.get_job(ns, name), "Stalled")
        return seen if seen.get("status") == "False" else None

    unstalled = wait_for(report_and_look, 45, "Stalled=False while progress moves", interval=0.5)
    assert (unstalled["reason"], unstalled["message"]) == ("NotStalled", "training is progressing")


def test_deleting_the_job_removes_every_child(cluster, operator, op_namespace):
    ns, name = op_namespace, "gone"
    cluster.create_job(ns, tiny_job(name))
    running_pod(cluster, ns, name)
    cluster.delete_job(ns, name)
    selector = f"colocgrpo.io/job-name={name}"

    def leftovers():
        found = []
        for prefix, plural in [
            ("/api/v1", "configmaps"),
            ("/api/v1", "services"),
            ("/api/v1", "serviceaccounts"),
            ("/apis/rbac.authorization.k8s.io/v1", "roles"),
            ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
            ("/apis/batch/v1", "jobs"),
            ("/api/v1", "pods"),
        ]:
            found += [f"{plural}/{o['metadata']['name']}" for o in cluster.list(prefix, plural, ns, selector)]
        return found

    wait_for(
        lambda: cluster.get_job(ns, name) is None and not leftovers(),
        45,
        "no job and no children",
        on_timeout=lambda: str(leftovers()),
    )


def test_ttl_deletes_finished_job(cluster, kube_cluster, operator, op_namespace):
    ns, name = op_namespace, "ephemeral"
    cluster.create_job(ns, tiny_job(name, runPolicy={"ttlSecondsAfterFinished": 2}))
    pod = running_pod(cluster, ns, name)
    drive_pod_success(kube_cluster.core_v1, ns, pod["metadata"]["name"])
    done = wait_phase(cluster, ns, name, "Succeeded", operator=operator)
    completed = datetime.fromisoformat(done["status"]["completionTime"].replace("Z", "+00:00"))
    wait_for(lambda: cluster.get_job(ns, name) is None, 20, "the TTL to delete the job")
    # Not before its time: measured from the recorded completionTime (whole seconds, so at most the true
    # moment), not from when this test saw the phase, which a loaded machine can delay past the deadline.
    assert (datetime.now(UTC) - completed).total_seconds() >= 2


def test_operator_killed_mid_reconcile_converges(cluster, kube_cluster, crd_installed, tmp_path):
    """SIGKILL the operator right after it started creating children; a new one finishes the job."""
    namespace = kube_cluster.new_namespace("kill")
    own = OperatorProcess(Path(kube_cluster.kubeconfig), [namespace], tmp_path / "operator.log")
    try:
        own.start()
        names = [f"k{i}" for i in range(5)]
        for name in names:
            cluster.create_job(namespace, tiny_job(name))
        # Kill as soon as the first child appears (some jobs half-done, some untouched).
        wait_for(
            lambda: cluster.list("/api/v1", "serviceaccounts", namespace, "colocgrpo.io/job-name"),
            30,
            "the first child",
            interval=0.05,
        )
        own.kill()
        before = {
            j["metadata"]["name"]: j["metadata"]["uid"] for j in cluster.list("/apis/batch/v1", "jobs", namespace)
        }
        own.start()
        for name in names:
            wait_phase(cluster, namespace, name, "Running", timeout=60, operator=own)
        jobs = cluster.list("/apis/batch/v1", "jobs", namespace)
        assert sorted(j["metadata"]["name"] for j in jobs) == sorted(names)  # exactly one Job each
        for job in jobs:
            if job["metadata"]["name"] in before:  # a Job that existed at the kill was kept, not replaced
                assert job["metadata"]["uid"] == before[job["metadata"]["name"]]
        for name in names:
            assert len([p for p in cluster.pods(namespace, name) if not p["metadata"].get("deletionTimestamp")]) == 1
            assert cluster.get_job(namespace, name)["status"]["restarts"] == 0
    finally:
        own.stop()
        kube_cluster.delete_namespace(namespace)


def test_fifty_jobs_at_once(cluster, operator, op_namespace):
    ns = op_namespace
    names = [f"many-{i:02d}" for i in range(50)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: cluster.create_job(ns, tiny_job(n)), names))

    def all_running():
        items = cluster.api.request("GET", f"/apis/colocgrpo.io/v1alpha1/namespaces/{ns}/colocgrpojobs")["items"]
        phases = [(i.get("status") or {}).get("phase") for i in items]
        return len(items) == 50 and all(p == "Running" for p in phases)

    wait_for(all_running, 90, "50 jobs Running", interval=1, on_timeout=operator.log_tail)
    elapsed = time.monotonic() - started
    assert len(cluster.list("/apis/batch/v1", "jobs", ns)) == 50
    metrics = operator.metrics()
    assert 'colocgrpo_jobs{phase="Running"}' in metrics
    assert "colocgrpo_reconcile_duration_seconds_bucket" in metrics
    print(f"50 jobs Running after {elapsed:.1f}s")


# --- garbage in every field ---------------------------------------------------------------------

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["", "-1", "1e9", "Never", "cpu", "a:b", "/etc/x", "Gi"])
)
_json = st.recursive(
    _leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=8), c, max_size=3),
    max_leaves=8,
)
_PATHS = [
    ("spec", "model"),
    ("spec", "model", "name"),
    ("spec", "resources", "nodes"),
    ("spec", "resources", "gpusPerNode"),
    ("spec", "resources", "cpu"),
    ("spec", "resources", "extra"),
    ("spec", "rewards"),
    ("spec", "rewards", 0, "function"),
    ("spec", "rewards", 0, "weight"),
    ("spec", "trainerArgs"),
    ("spec", "trainerArgs", "max_steps"),
    ("spec", "trainerArgs", "bogus_arg"),
    ("spec", "scheduling", "tolerations"),
    ("spec", "scheduling", "affinity"),
    ("spec", "scheduling", "nodeSelector"),
    ("spec", "podTemplate", "env"),
    ("spec", "podTemplate", "volumes"),
    ("spec", "podTemplate", "volumeMounts"),
    ("spec", "runPolicy", "maxRestarts"),
    ("spec", "image"),
    ("spec", "command"),
    ("spec", "dataset"),
    ("spec", "checkpoint", "path"),
    ("spec", "vllm"),
    ("metadata", "labels"),
    ("metadata", "annotations"),
]


def test_garbage_in_every_field_never_crashes_the_operator(cluster, operator, op_namespace):
    """Fuzzed specs go through the real API server; whatever it stores, the operator must judge
    (SpecValid True or False) without dying, and still run a valid job afterwards."""
    from colocgrpo_operator.kube.client import KubeApiError

    ns = op_namespace
    accepted: list[str] = []
    counter = iter(range(10_000))

    # Garbage the schema lets through (free-form Kubernetes fields, any trainerArgs key) reaches
    # the operator; garbage of the wrong type is refused at the door. Both kinds are drawn.
    likely_stored = st.one_of(
        st.tuples(st.tuples(st.just("spec"), st.just("trainerArgs"), st.text(min_size=1, max_size=12)), _json),
        st.tuples(
            st.just(("spec", "scheduling", "tolerations")),
            st.lists(
                st.dictionaries(st.sampled_from(["key", "operator", "effect", "value", "x"]), _leaf, max_size=3),
                max_size=2,
            ),
        ),
        st.tuples(st.just(("spec", "scheduling", "affinity")), st.dictionaries(st.text(max_size=8), _json, max_size=2)),
        st.tuples(
            st.just(("spec", "podTemplate", "env")),
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.text(min_size=1, max_size=10)}, optional={"value": _leaf, "valueFrom": _json}
                ),
                max_size=2,
            ),
        ),
        st.tuples(st.just(("spec", "resources", "cpu")), st.sampled_from(["1", "0", "100000", "1m", "1e3"])),
        st.tuples(st.just(("spec", "image")), st.text(min_size=1, max_size=20)),
    )

    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        mutations=st.lists(st.one_of(likely_stored, st.tuples(st.sampled_from(_PATHS), _json)), min_size=1, max_size=4)
    )
    def store(mutations):
        name = f"fuzz-{next(counter)}"
        body = tiny_job(name)
        for path, value in mutations:
            set_path(body, path, value)
        try:
            cluster.create_job(ns, body)
        except KubeApiError as error:
            assert error.status in (400, 422), error  # refused at the door, with a reason
            return
        accepted.append(name)

    store()
    assert operator.alive()
    assert accepted, "the API server refused every fuzzed job; the operator was never exercised"

    def judged():
        pending = []
        for name in accepted:
            obj = cluster.get_job(ns, name)
            if obj is None or not condition(obj, "SpecValid") or not (obj.get("status") or {}).get("phase"):
                pending.append(name)
        return not pending or None

    wait_for(
        judged,
        60,
        f"every one of {len(accepted)} accepted fuzzed jobs to get a status",
        interval=1,
        on_timeout=operator.log_tail,
    )
    assert operator.alive() and operator.healthy()
    cluster.create_job(ns, tiny_job("after-fuzz"))
    wait_phase(cluster, ns, "after-fuzz", "Running", operator=operator)
    verdicts = {}
    for name in accepted:
        obj = cluster.get_job(ns, name)
        key = (obj["status"]["phase"], condition(obj, "SpecValid").get("reason"))
        verdicts[key] = verdicts.get(key, 0) + 1
    print(f"{len(accepted)} fuzzed jobs stored and judged: {verdicts}")


def _cli(kube_cluster, *args, timeout=60):
    import subprocess
    import sys

    from support.operator_harness import REPO

    env = dict(__import__("os").environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    return subprocess.Popen(
        [sys.executable, "-m", "colocgrpo_operator.cli", *args, f"--kubeconfig={kube_cluster.kubeconfig}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_watch_exits_with_the_outcome_and_logs_finds_rank0(cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    cluster.create_job(ns, tiny_job("ok"))
    cluster.create_job(ns, tiny_job("doomed", runPolicy={"maxRestarts": 0}))
    ok_pod, doomed_pod = running_pod(cluster, ns, "ok"), running_pod(cluster, ns, "doomed")
    watch_ok = _cli(kube_cluster, "watch", "ok", "-n", ns, "--plain", "--timeout", "60")
    watch_doomed = _cli(kube_cluster, "watch", "doomed", "-n", ns, "--plain", "--timeout", "60")
    watch_timeout = _cli(kube_cluster, "watch", "doomed", "-n", ns, "--plain", "--timeout", "1")
    assert watch_timeout.wait(30) == 3  # still Running after 1 s
    drive_pod_success(kube_cluster.core_v1, ns, ok_pod["metadata"]["name"])
    drive_pod_failure(kube_cluster.core_v1, ns, doomed_pod["metadata"]["name"], exit_code=2)
    out_ok, _ = watch_ok.communicate(timeout=60)
    out_doomed, _ = watch_doomed.communicate(timeout=60)
    assert watch_ok.returncode == 0 and "Succeeded" in out_ok, out_ok
    assert watch_doomed.returncode == 1 and "Failed" in out_doomed, out_doomed
    logs = _cli(kube_cluster, "logs", "ok", "-n", ns)
    out_logs, _ = logs.communicate(timeout=60)
    assert logs.returncode == 0, out_logs
    missing = _cli(kube_cluster, "logs", "ok", "--rank", "5", "-n", ns)
    out_missing, _ = missing.communicate(timeout=60)
    assert missing.returncode == 1 and "rank 5" in out_missing  # not found, as kubectl says it


def test_frozen_trainer_args_change_is_refused_not_rolled_out(cluster, operator, op_namespace):
    ns, name = op_namespace, "frozen"
    cluster.create_job(ns, tiny_job(name))
    wait_phase(cluster, ns, name, "Running", operator=operator)
    before = trainer_config_text(cluster, ns, name)
    cluster.patch_job(ns, name, {"spec": {"trainerArgs": {"learning_rate": 0.5}}})
    wait_event(cluster, ns, "ImmutableField", "spec.trainerArgs", 20)
    after = trainer_config_text(cluster, ns, name)
    assert after == before
    assert phase(cluster, ns, name) == "Running"
