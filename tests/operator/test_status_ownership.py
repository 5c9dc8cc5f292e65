"""The job's outcome belongs to the operator, against the real apiserver.

Each job's trainer runs as the ServiceAccount `<job>-trainer`, allowed to patch that job's
status subresource so it can report `status.progress`. These tests hold that account's own
token (issued by the TokenRequest API, as a pod gets it) and try what a compromised trainer or
a user reward module could: forge the phase, the completion time (with a TTL), the restart
count, the start time, the conditions. The admission policy the chart ships refuses each of
them; and where no policy is installed (the same forgeries written with the admin's
credentials, which no policy restricts), the operator repairs them within seconds, never
deletes the job, and keeps counting restarts from its own record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success
from colocgrpo_operator.api.naming import RECORD_ANNOTATION
from colocgrpo_operator.kube.client import KubeApiError
from support.operator_harness import (
    Cluster,
    OperatorProcess,
    condition,
    report_progress,
    running_pod,
    tiny_job,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster

PAST = "2020-01-01T00:00:00Z"
FUTURE = "2099-01-01T00:00:00Z"
FORGED_RUNNING = {
    "type": "Running",
    "status": "True",
    "reason": "AllWorkersRunning",
    "message": "forged",
    "lastTransitionTime": FUTURE,
}

# What a trainer's token could write into the status before the cluster refused it.
FORGERIES: dict[str, dict[str, Any]] = {
    "phase-succeeded": {"phase": "Succeeded"},
    "phase-failed": {"phase": "Failed", "message": "forged"},
    "succeeded-past-completion": {"phase": "Succeeded", "completionTime": PAST},
    "restarts": {"restarts": 5, "disruptions": 5},
    "start-time": {"startTime": FUTURE},
    "last-failure": {"lastFailure": {"reason": "Forged", "jobUid": "forged", "counted": True}},
    "conditions": {"conditions": [FORGED_RUNNING]},
}

REPAIR_SECONDS = 10


def trainer_of(cluster: Cluster, namespace: str, job: str, tmp_path: Path) -> Cluster:
    return cluster.as_service_account(namespace, f"{job}-trainer", tmp_path)


def refusal(trainer: Cluster, namespace: str, job: str, status: dict[str, Any], dry_run: bool = False) -> KubeApiError:
    with pytest.raises(KubeApiError) as refused:
        trainer.patch_job(namespace, job, {"status": status}, subresource="status", dry_run=dry_run)
    return refused.value


def wait_until_policy_enforced(trainer: Cluster, namespace: str, job: str) -> None:
    """A new policy takes effect once the apiserver's admission plugin has seen it: wait for a
    dry-run forgery to be refused (a dry run goes through admission, and changes nothing)."""

    def refused() -> bool:
        try:
            trainer.patch_job(namespace, job, {"status": {"phase": "Succeeded"}}, subresource="status", dry_run=True)
        except KubeApiError as error:
            return error.status == 403
        return False

    wait_for(refused, 30, "the trainer status policy to refuse a dry-run forgery")


def record_of(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    annotations = (cluster.get_job(namespace, job) or {}).get("metadata", {}).get("annotations") or {}
    return json.loads(annotations[RECORD_ANNOTATION])


def test_the_trainer_token_may_write_progress_and_nothing_else(cluster, kube_cluster, operator, op_namespace, tmp_path):
    ns, name = op_namespace, "owned"
    cluster.create_job(ns, tiny_job(name, runPolicy={"ttlSecondsAfterFinished": 30}))
    running = wait_phase(cluster, ns, name, "Running", operator=operator)
    trainer = trainer_of(cluster, ns, name, tmp_path)
    wait_until_policy_enforced(trainer, ns, name)

    for what, forged in FORGERIES.items():
        error = refusal(trainer, ns, name, forged)
        assert error.status == 403, (what, error)
        assert "may change status.progress only" in error.message, (what, error.message)
    # Removing what the operator wrote is a change too.
    assert refusal(trainer, ns, name, {"startTime": None, "conditions": None}).status == 403

    # Progress is the trainer's: accepted, and kept by the operator.
    progress = {"step": 1, "maxSteps": 2, "metrics": {"reward": 0.25}, "lastUpdateTime": "2026-01-01T00:00:00Z"}
    trainer.patch_job(ns, name, {"status": {"progress": progress}}, subresource="status")
    assert cluster.get_job(ns, name)["status"]["progress"] == progress

    # The status subresource never changes metadata, where the operator keeps its record.
    record_before = record_of(cluster, ns, name)
    forged_record = json.dumps({"restarts": 0, "outcome": {"phase": "Succeeded"}})
    trainer.patch_job(ns, name, {"metadata": {"annotations": {RECORD_ANNOTATION: forged_record}}}, subresource="status")
    assert record_of(cluster, ns, name) == record_before
    # Nor may the token touch the job itself (RBAC: get only).
    for patch in ({"metadata": {"annotations": {RECORD_ANNOTATION: forged_record}}}, {"spec": {"suspend": True}}):
        with pytest.raises(KubeApiError) as refused:
            trainer.patch_job(ns, name, patch)
        assert refused.value.status == 403

    now = cluster.get_job(ns, name)
    assert now["status"]["phase"] == "Running"
    assert now["status"]["startTime"] == running["status"]["startTime"]
    assert "completionTime" not in now["status"]
    drive_pod_success(kube_cluster.core_v1, ns, now["status"]["rank0Pod"])
    done = wait_phase(cluster, ns, name, "Succeeded", operator=operator)
    assert done["status"]["progress"] == progress


def test_forged_status_is_repaired_and_restarts_count_from_the_record(cluster, kube_cluster, crd_installed, tmp_path):
    """The same forgeries where no policy stops them. The operator re-checks only every 300 s
    here, so the repairs within 10 s come from its reaction to the status change itself."""
    namespace = kube_cluster.new_namespace("repair")
    own = OperatorProcess(Path(kube_cluster.kubeconfig), [namespace], tmp_path / "operator.log", recheck_seconds=300)
    name = "forged"
    try:
        own.start()
        cluster.create_job(namespace, tiny_job(name, runPolicy={"maxRestarts": 1, "ttlSecondsAfterFinished": 2}))
        first_pod = running_pod(cluster, namespace, name)
        original = wait_phase(cluster, namespace, name, "Running", operator=own)["status"]
        trainer = trainer_of(cluster, namespace, name, tmp_path)

        def repaired(restarts: int) -> Any:
            obj = cluster.get_job(namespace, name)
            status = (obj or {}).get("status") or {}
            running = condition(obj, "Running")
            return (
                status.get("phase") == "Running"
                and "completionTime" not in status
                and status.get("restarts") == restarts
                and status.get("startTime") == original["startTime"]
                and (status.get("lastFailure") or {}).get("reason") != "Forged"
                and running.get("message") != "forged"
                and running.get("lastTransitionTime") != FUTURE
                and obj
            )

        for what, forged in FORGERIES.items():
            cluster.patch_job(namespace, name, {"status": forged}, subresource="status")
            forged_at = time.monotonic()
            wait_for(lambda: repaired(0), REPAIR_SECONDS, f"the {what} forgery to be repaired", on_timeout=own.log_tail)
            assert time.monotonic() - forged_at < REPAIR_SECONDS
        # The TTL (2 s) never fired on the forged completion time: the job and its gang are there.
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert cluster.get_job(namespace, name) is not None, "the job was deleted"
            time.sleep(0.5)
        assert running_pod(cluster, namespace, name)["metadata"]["uid"] == first_pod["metadata"]["uid"]

        # Progress still reaches the status (and is still the trainer's to write).
        progress = {"step": 3, "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        trainer.patch_job(namespace, name, {"status": {"progress": progress}}, subresource="status")
        wait_for(lambda: cluster.get_job(namespace, name)["status"].get("progress") == progress, 5, "progress")

        # The frozen job of the forged phase would not have restarted; this one does, and counts.
        drive_pod_failure(kube_cluster.core_v1, namespace, first_pod["metadata"]["name"], exit_code=1)
        second_pod = running_pod(cluster, namespace, name, exclude_uid=first_pod["metadata"]["uid"], timeout=45)
        wait_for(lambda: repaired(1), 30, "the restarted gang Running with restarts 1", on_timeout=own.log_tail)
        assert record_of(cluster, namespace, name)["restarts"] == 1

        # A forged restart count is repaired from the record, so maxRestarts=1 still holds.
        cluster.patch_job(namespace, name, {"status": {"restarts": 0, "lastFailure": None}}, subresource="status")
        wait_for(lambda: repaired(1), REPAIR_SECONDS, "the restart count repaired", on_timeout=own.log_tail)
        drive_pod_failure(kube_cluster.core_v1, namespace, second_pod["metadata"]["name"], exit_code=1)
        failed = wait_phase(cluster, namespace, name, "Failed", operator=own)
        assert condition(failed, "Failed")["reason"] == "MaxRestartsExceeded"
        assert len(cluster.batch_jobs(namespace, name)) <= 1  # no third gang

        # Finished for real: now the TTL deletes it.
        wait_for(lambda: cluster.get_job(namespace, name) is None, 30, "the TTL to delete the failed job")
    finally:
        own.stop()
        kube_cluster.delete_namespace(namespace)


def test_a_deleted_incarnations_trainer_writes_nothing_on_its_successor(
    cluster, kube_cluster, operator, op_namespace, tmp_path
):
    """A job deleted and created again under the same name: the old trainer (alive through its
    grace period, its token still accepted for a while by the API server's token cache) reports
    progress the way every trainer does, bound to the uid of the job it was rendered for; the new
    job's progress stays untouched."""
    from colocgrpo_operator.api.naming import GRPO_CONFIG_KEY
    from colocgrpo_training.config import TrainerConfig

    ns, name = op_namespace, "phoenix"

    def rendered_for(uid: str) -> TrainerConfig:
        """The trainer config in the job's ConfigMap, once it is the one rendered for `uid`."""

        def current() -> TrainerConfig | None:
            found = cluster.list("/api/v1", "configmaps", ns, f"colocgrpo.io/job-name={name}")
            for item in found:
                config = TrainerConfig.from_yaml((item.get("data") or {}).get(GRPO_CONFIG_KEY, "") or "{}")
                if config.job.uid == uid:
                    return config
            return None

        return wait_for(
            current, 60, f"the trainer config of {name} rendered for uid {uid}", on_timeout=operator.log_tail
        )

    def write_progress(trainer: Cluster, config: TrainerConfig, step: int) -> None:
        report_progress(trainer, ns, name, config.job.uid, step)

    first = cluster.create_job(ns, tiny_job(name))
    wait_phase(cluster, ns, name, "Running", operator=operator)
    old_config = rendered_for(first["metadata"]["uid"])
    (tmp_path / "old").mkdir()
    old_trainer = trainer_of(cluster, ns, name, tmp_path / "old")  # the first incarnation's token
    write_progress(old_trainer, old_config, 916)
    assert cluster.get_job(ns, name)["status"]["progress"]["step"] == 916

    cluster.delete_job(ns, name)
    wait_for(lambda: cluster.get_job(ns, name) is None, 30, "the first incarnation gone")
    second = cluster.create_job(ns, tiny_job(name))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    wait_phase(cluster, ns, name, {"Starting", "Running"}, operator=operator)
    # At once and for the next seconds (the token cache's window), every report of the old
    # trainer is refused: by the uid precondition while its token is still accepted (422), by
    # authentication or RBAC once it is not.
    deadline = time.monotonic() + 12
    refusals = []
    while time.monotonic() < deadline:
        with pytest.raises(KubeApiError) as refused:
            write_progress(old_trainer, old_config, 917)
        refusals.append(refused.value.status)
        time.sleep(1)
    assert set(refusals) <= {401, 403, 422}, refusals
    assert "progress" not in (cluster.get_job(ns, name).get("status") or {})
    # The new incarnation's trainer, rendered for the new uid, reports as ever.
    new_config = rendered_for(second["metadata"]["uid"])
    (tmp_path / "new").mkdir()
    write_progress(trainer_of(cluster, ns, name, tmp_path / "new"), new_config, 1)
    assert cluster.get_job(ns, name)["status"]["progress"]["step"] == 1
