"""Status derivation (controller/status.py and the modules beside it): pure, so every phase and reason
is checked here."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from colocgrpo_operator.api import Phase
from colocgrpo_operator.api.model import FIRST_STEP_ALLOWANCE_SECONDS
from colocgrpo_operator.controller.conditions import condition_of, set_condition
from colocgrpo_operator.controller.failures import reason_from_termination_message
from colocgrpo_operator.controller.objects import format_time
from colocgrpo_operator.controller.record import Outcome, Record
from colocgrpo_operator.controller.status import Action, Assessment, RunFacts, invalid_spec_status, remaining_deadline
from colocgrpo_operator.controller.status import assess as derive
from colocgrpo_operator.controller.workers import creation_refusal

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
JOB_UID = "job-uid-1"


def batch_job(
    uid: str = JOB_UID,
    suspend: bool = False,
    conditions: list[dict] | None = None,
    deleting: bool = False,
    start: str | None = "2026-01-02T03:00:00Z",
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "metadata": {"name": "demo", "namespace": "ns", "uid": uid},
        "spec": {"suspend": suspend, "completions": 2, "parallelism": 2},
        "status": {"conditions": conditions or []},
    }
    if start and not suspend:
        job["status"]["startTime"] = start
    if deleting:
        job["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:00Z"
    return job


def pod(
    index: int,
    phase: str = "Running",
    uid: str = JOB_UID,
    *,
    waiting: str | None = None,
    terminated: dict | None = None,
    conditions: list[dict] | None = None,
    node: str | None = "gpu-0",
    reason: str | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-01-02T03:01:00Z"}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} details"}}
    if terminated is not None:
        state = {"terminated": terminated}
    ready = phase == "Running" and waiting is None and terminated is None
    body: dict[str, Any] = {
        "metadata": {
            "name": f"demo-{index}-x",
            "labels": {"batch.kubernetes.io/job-completion-index": str(index), "colocgrpo.io/job-name": "demo"},
            "ownerReferences": [{"kind": "Job", "name": "demo", "uid": uid}],
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": phase,
            "conditions": (conditions or []) + [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "trainer", "state": state}],
        },
    }
    if reason:
        body["status"]["reason"] = reason
    return body


def failed(
    index: int,
    exit_code: int = 1,
    message: str = "",
    reason: str = "Error",
    finished: str = "2026-01-02T03:02:00Z",
    **kwargs: Any,
) -> dict[str, Any]:
    return pod(
        index,
        "Failed",
        terminated={"exitCode": exit_code, "reason": reason, "message": message, "finishedAt": finished},
        **kwargs,
    )


FACTS = RunFacts(nodes=2, gpus_per_node=8, max_restarts=2, generation=1)


def assess(
    facts: RunFacts,
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    before: Assessment | dict[str, Any] | None,
    now: datetime,
    progress: dict[str, Any] | None = None,
    workloads: list[dict[str, Any]] | None = None,
) -> Assessment:
    """The reconcile after `before`: the previous one's outcome (the status it wrote and the record it
    kept), or a status alone, whose record is then taken from it as from an earlier operator's."""
    if isinstance(before, Assessment):
        record, previous = before.record, before.status
    else:
        record, previous = (Record.from_status(before) if before else Record()), before
    return derive(facts, job, pods, record, previous, now, progress, workloads)


def cond(status: dict, type_: str) -> dict:
    found = condition_of(status, type_)
    assert found is not None, f"no {type_} condition in {status.get('conditions')}"
    return found


def test_no_job_yet_is_pending_and_asks_for_a_job():
    result = assess(FACTS, None, [], None, NOW)
    assert result.phase == "Pending"
    assert result.action is Action.CREATE_JOB
    assert cond(result.status, "SpecValid")["status"] == "True"
    assert "progress" not in result.status


def test_all_workers_running_is_running_with_rank0_and_counts():
    result = assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW)
    assert result.phase == "Running"
    assert result.action is Action.NONE
    assert result.status["rank0Pod"] == "demo-0-x"
    assert result.status["workers"] == {"active": 2, "ready": 2, "succeeded": 0, "failed": 0, "gpus": 16}
    assert cond(result.status, "Running")["status"] == "True"
    assert result.status["startTime"] == "2026-01-02T03:00:00Z"


def test_pods_of_an_older_job_are_ignored():
    result = assess(FACTS, batch_job(), [pod(0), pod(1, uid="old-uid")], None, NOW)
    assert result.phase == "Starting"
    assert result.status["workers"]["active"] == 1


def test_unschedulable_carries_the_scheduler_message():
    unschedulable = pod(
        1,
        "Pending",
        node=None,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    unschedulable["status"]["containerStatuses"] = []
    result = assess(FACTS, batch_job(), [pod(0), unschedulable], None, NOW)
    assert result.phase == "Starting"
    running = cond(result.status, "Running")
    assert running["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in running["message"]
    assert "Insufficient nvidia.com/gpu" in result.status["message"]


@pytest.mark.parametrize("waiting", ["ImagePullBackOff", "ErrImagePull"])
def test_image_pull_problems(waiting):
    result = assess(FACTS, batch_job(), [pod(0, "Pending", waiting=waiting), pod(1)], None, NOW)
    assert result.phase == "Starting"
    assert cond(result.status, "Running")["reason"] == "ImagePullBackOff"


def test_unschedulable_outranks_image_pull():
    stuck = pod(
        0,
        "Pending",
        node=None,
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no gpus"}],
    )
    result = assess(FACTS, batch_job(), [stuck, pod(1, "Pending", waiting="ImagePullBackOff")], None, NOW)
    assert cond(result.status, "Running")["reason"] == "Unschedulable"


def test_crash_loop_is_reported():
    result = assess(FACTS, batch_job(), [pod(0, "Running", waiting="CrashLoopBackOff"), pod(1)], None, NOW)
    assert cond(result.status, "Running")["reason"] == "CrashLoopBackOff"


REFUSAL = (
    'Error creating: pods "demo-1-abcde" is forbidden: violates PodSecurity "restricted:latest": '
    'runAsNonRoot != true (pod or container "trainer" must set securityContext.runAsNonRoot=true)'
)


def refuse(job, pods, previous=None, now=NOW, refusal=REFUSAL, facts=FACTS):
    """The reconcile that looked the Job's FailedCreate Events up and found `refusal`."""
    return derive(facts, job, pods, Record(), previous, now, creation_refusal=refusal)


def test_missing_pods_ask_why_and_report_the_job_controllers_refusal():
    job = batch_job()  # started 4 minutes before NOW
    plain = assess(FACTS, job, [pod(0)], None, NOW)
    # Without the Events' answer nothing is invented; the lookup is asked for.
    assert plain.check_pod_creation and cond(plain.status, "Running")["reason"] == "WaitingForPods"
    result = refuse(job, [pod(0)])
    assert result.phase == "Starting" and result.action is Action.NONE  # it can recover: never Failed
    running = cond(result.status, "Running")
    assert running["status"] == "False" and running["reason"] == "PodCreationFailed"
    assert running["message"].startswith("1/2 workers created; the Job controller cannot create the others: ")
    assert "violates PodSecurity" in running["message"] and "violates PodSecurity" in result.status["message"]
    assert cond(result.status, "Failed")["status"] == "False"
    # No pod at all: the same.
    assert cond(refuse(job, []).status, "Running")["message"].startswith("0/2 workers created;")


def test_a_pod_that_cannot_be_created_outranks_how_the_others_wait():
    stuck = pod(
        0,
        "Pending",
        node=None,
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no gpus"}],
    )
    assert cond(refuse(batch_job(), [stuck]).status, "Running")["reason"] == "PodCreationFailed"


@pytest.mark.parametrize(
    ("job", "pods"),
    [
        (batch_job(start="2026-01-02T03:04:02Z"), []),  # started 3 s ago: pods come within the grace period
        (batch_job(start=None), []),  # the Job controller has not started it yet
        (batch_job(), [pod(0, "Pending", waiting="ContainerCreating"), pod(1)]),  # every pod exists
        (batch_job(), [pod(0, "Succeeded"), pod(1, "Pending", waiting="ContainerCreating")]),
    ],
)
def test_no_lookup_and_no_refusal_unless_pods_are_missing_past_the_grace_period(job, pods):
    assert not assess(FACTS, job, pods, None, NOW).check_pod_creation
    # An answer given anyway (a stale Event) changes nothing.
    assert cond(refuse(job, pods).status, "Running")["reason"] != "PodCreationFailed"


def test_suspended_queued_and_running_jobs_never_ask():
    assert not assess(FACTS, batch_job(suspend=True), [], None, NOW).check_pod_creation
    assert not assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW).check_pod_creation
    assert not assess(FACTS, None, [], None, NOW).check_pod_creation


def test_the_refusal_clears_once_the_pods_are_created():
    refused = refuse(batch_job(), [])
    later = NOW + timedelta(seconds=30)
    created = derive(
        FACTS,
        batch_job(),
        [pod(0, "Pending", waiting="ContainerCreating"), pod(1)],
        refused.record,
        refused.status,
        later,
    )
    running = cond(created.status, "Running")
    assert created.phase == "Starting" and running["reason"] == "ContainerCreating"
    assert "cannot create" not in created.status["message"]
    # Running stayed False throughout, so its transition time is the first one's.
    assert running["lastTransitionTime"] == cond(refused.status, "Running")["lastTransitionTime"]
    running_now = derive(FACTS, batch_job(), [pod(0), pod(1)], created.record, created.status, later)
    assert running_now.phase == "Running"


def _event(message, uid=JOB_UID, reason="FailedCreate", last="2026-01-02T03:01:00Z", **extra):
    return {"reason": reason, "message": message, "involvedObject": {"uid": uid}, "lastTimestamp": last, **extra}


def test_the_newest_failed_create_event_of_the_job_is_the_refusal():
    events = [
        _event("old quota refusal", last="2026-01-02T03:00:00Z"),
        _event("(combined from similar events): newest PodSecurity refusal", last="2026-01-02T03:03:00Z"),
        _event("another Job's refusal", uid="other", last="2026-01-02T03:04:00Z"),
        _event("created pod", reason="SuccessfulCreate", last="2026-01-02T03:04:00Z"),
        # The events.k8s.io shape: no lastTimestamp, the series says when it last happened.
        _event("series refusal", last=None, series={"lastObservedTime": "2026-01-02T03:02:00.123456Z"}),
        "not an event",
        _event(None, last="2026-01-02T03:04:00Z"),
    ]
    assert creation_refusal(events, JOB_UID) == "newest PodSecurity refusal"
    assert creation_refusal(events[4:5], JOB_UID) == "series refusal"
    assert creation_refusal(events, "unknown-uid") is None
    assert creation_refusal([], JOB_UID) is None and creation_refusal(events, None) is None
    assert len(creation_refusal([_event("x" * 5000)], JOB_UID) or "") == 2000


def test_success():
    job = batch_job(conditions=[{"type": "Complete", "status": "True"}])
    job["status"]["completionTime"] = "2026-01-02T03:04:00Z"
    result = assess(FACTS, job, [pod(0, "Succeeded"), pod(1, "Succeeded")], None, NOW)
    assert result.phase == "Succeeded"
    assert cond(result.status, "Succeeded")["status"] == "True"
    assert cond(result.status, "Failed")["status"] == "False"
    assert result.status["completionTime"] == "2026-01-02T03:04:00Z"


def test_terminal_phase_is_latched():
    done = assess(FACTS, batch_job(conditions=[{"type": "Complete", "status": "True"}]), [], None, NOW)
    later = assess(FACTS, None, [], done, NOW + timedelta(minutes=5))
    assert later.phase == "Succeeded"
    assert later.action is Action.NONE


def test_failure_restarts_the_gang_and_counts():
    result = assess(FACTS, batch_job(), [failed(0), pod(1)], None, NOW)
    assert result.phase == "Restarting"
    assert result.action is Action.RESTART_GANG
    assert result.status["restarts"] == 1
    assert result.status["lastFailure"]["jobUid"] == JOB_UID
    assert result.status["lastFailure"]["exitCode"] == 1


def test_the_same_failed_job_is_counted_once():
    first = assess(FACTS, batch_job(), [failed(0)], None, NOW)
    again = assess(FACTS, batch_job(), [failed(0)], first, NOW + timedelta(seconds=3))
    assert again.status["restarts"] == 1
    assert again.action is Action.RESTART_GANG


def test_restart_then_recreate_then_fail_after_max_restarts():
    before = None
    for attempt in range(FACTS.max_restarts):
        uid = f"uid-{attempt}"
        result = assess(FACTS, batch_job(uid=uid), [failed(0, uid=uid)], before, NOW)
        assert result.phase == "Restarting" and result.action is Action.RESTART_GANG
        deleting = assess(FACTS, batch_job(uid=uid, deleting=True), [], result, NOW)
        assert deleting.phase == "Restarting" and deleting.action is Action.NONE
        gone = assess(FACTS, None, [], deleting, NOW)
        assert gone.phase == "Restarting" and gone.action is Action.CREATE_JOB
        before = gone
    assert before is not None and before.status["restarts"] == FACTS.max_restarts
    final = assess(FACTS, batch_job(uid="last"), [failed(1, uid="last", message="boom")], before, NOW)
    assert final.phase == "Failed"
    assert final.action is Action.NONE
    failed_condition = cond(final.status, "Failed")
    assert failed_condition["status"] == "True"
    assert failed_condition["reason"] == "MaxRestartsExceeded"
    assert final.status["restarts"] == FACTS.max_restarts
    assert "completionTime" in final.status


def test_max_restarts_zero_fails_at_once():
    facts = RunFacts(nodes=1, max_restarts=0)
    result = assess(facts, batch_job(), [failed(0, reason="OOMKilled", exit_code=137)], None, NOW)
    assert result.phase == "Failed"
    assert cond(result.status, "Failed")["reason"] == "MaxRestartsExceeded"
    assert cond(result.status, "Running")["reason"] == "OOMKilled"
    assert "OOMKilled" in result.status["message"]


def test_eviction_restarts_without_counting():
    evicted = failed(
        0,
        exit_code=137,
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "node pressure"}
        ],
    )
    facts = RunFacts(nodes=2, max_restarts=0)
    result = assess(facts, batch_job(), [evicted, failed(1, message="NCCL timeout")], None, NOW)
    assert result.phase == "Restarting"
    assert result.action is Action.RESTART_GANG
    assert result.status["restarts"] == 0
    assert result.status["disruptions"] == 1
    assert result.status["lastFailure"]["counted"] is False
    assert cond(result.status, "Running")["reason"] == "Evicted"


def test_preemption_is_named():
    preempted = failed(
        0,
        exit_code=143,  # the ranks stopped at a checkpoint on the preemption's SIGTERM (colocgrpo-launch)
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    )
    result = assess(FACTS, batch_job(), [preempted], None, NOW)
    assert cond(result.status, "Running")["reason"] == "Preempted"
    assert result.status["lastFailure"]["exitCode"] == 143 and result.status["lastFailure"]["counted"] is False


@pytest.mark.parametrize(
    "message",
    [json.dumps({"reason": "Terminated", "message": "stopped by signal 15 at step 7; checkpoint-7 saved"}), ""],
    ids=["trainer-checkpointed", "no-message"],
)
def test_a_pod_stopped_by_sigterm_is_preempted_and_not_counted(message):
    # 143 = 128 + SIGTERM, what a trainer pod exits with when its ranks stopped at a checkpoint on a SIGTERM that
    # came with no DisruptionTarget condition (a preemption or node shutdown the kubelet did not mark).
    stopped = failed(0, exit_code=143, message=message)
    facts = RunFacts(nodes=2, max_restarts=0)
    result = assess(facts, batch_job(), [stopped, failed(1, message="NCCL timeout", finished="2026-01-02T03:03:00Z")],
                    None, NOW)  # fmt: skip
    assert result.phase == "Restarting" and result.action is Action.RESTART_GANG
    assert cond(result.status, "Running")["reason"] == "Preempted"
    assert result.status["lastFailure"]["reason"] == "Preempted"
    assert result.status["lastFailure"]["counted"] is False and result.status["lastFailure"]["exitCode"] == 143
    assert (result.status["restarts"], result.status["disruptions"]) == (0, 1)
    assert "SIGTERM" in result.status["message"]


def test_a_trainer_failure_that_exits_143_keeps_its_reason():
    # 143 with a reason of the trainer's own (it failed, then was stopped) is that failure, counted.
    oom = failed(0, exit_code=143, message=json.dumps({"reason": "CUDAOutOfMemory", "message": "2 GiB"}))
    result = assess(FACTS, batch_job(), [oom], None, NOW)
    assert result.status["lastFailure"]["reason"] == "CUDAOutOfMemory"
    assert result.status["restarts"] == 1


def test_legacy_eviction_without_condition():
    result = assess(FACTS, batch_job(), [pod(0, "Failed", reason="Evicted")], None, NOW)
    assert result.status["disruptions"] == 1


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (json.dumps({"reason": "CUDAOutOfMemory", "message": "tried to allocate 2 GiB"}), "CUDAOutOfMemory"),
        (json.dumps({"reason": "NCCLTimeout", "message": "allreduce timed out"}), "NCCLTimeout"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "CUDAOutOfMemory"),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)", "NCCLTimeout"),
        ("segfault", "Error"),
        (json.dumps({"reason": "not a reason!", "message": "CUDA out of memory"}), "CUDAOutOfMemory"),
    ],
)
def test_termination_message_reasons(message, reason):
    result = assess(FACTS, batch_job(), [failed(0, message=message)], None, NOW)
    assert cond(result.status, "Running")["reason"] == reason
    assert result.status["lastFailure"]["reason"] == reason


def test_a_reward_functions_exception_is_its_own_counted_retried_reason():
    named = "rank 2 failed during generation and rewards: reward function judge:score (rewards[0]) raised ValueError"
    message = json.dumps({"reason": "RewardFunctionError", "message": named})
    result = assess(FACTS, batch_job(), [failed(0, message=message)], None, NOW)
    assert result.status["lastFailure"]["reason"] == "RewardFunctionError"
    assert named in result.status["lastFailure"]["message"]
    assert result.phase == "Restarting"
    assert result.status["restarts"] == 1


def test_oom_killed():
    result = assess(FACTS, batch_job(), [failed(0, exit_code=137, reason="OOMKilled")], None, NOW)
    assert result.status["lastFailure"]["reason"] == "OOMKilled"
    assert result.phase == "Restarting"


def test_first_pod_to_die_is_the_cause():
    cause = failed(1, reason="OOMKilled", exit_code=137, finished="2026-01-02T03:01:00Z")
    victim = failed(0, message="NCCL watchdog timeout", finished="2026-01-02T03:03:00Z")
    result = assess(FACTS, batch_job(), [victim, cause], None, NOW)
    assert result.status["lastFailure"]["reason"] == "OOMKilled"


@pytest.mark.parametrize("reason", ["InvalidConfig", "DataError"])
def test_non_retryable_trainer_errors_fail_at_once(reason):
    message = json.dumps({"reason": reason, "message": "dataset column missing"})
    result = assess(FACTS, batch_job(), [failed(0, message=message)], None, NOW)
    assert result.phase == "Failed"
    assert result.action is Action.NONE
    assert cond(result.status, "Failed")["reason"] == reason


def test_job_deadline_exceeded():
    job = batch_job(
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline",
            }
        ]
    )
    result = assess(FACTS, job, [], None, NOW)
    assert result.phase == "Failed"
    assert cond(result.status, "Failed")["reason"] == "DeadlineExceeded"


def test_deadline_counts_across_restarts():
    facts = RunFacts(nodes=1, active_deadline_seconds=600)
    assert remaining_deadline(facts, Record(), NOW) == 600
    started = Record(start_time=format_time(NOW - timedelta(seconds=100)))
    assert remaining_deadline(facts, started, NOW) == 500
    expired = Record(restarts=1, start_time=format_time(NOW - timedelta(seconds=700)))
    assert remaining_deadline(facts, expired, NOW) == 0
    result = derive(facts, None, [], expired, {"phase": "Restarting"}, NOW)
    assert result.phase == "Failed"
    assert result.action is Action.NONE
    assert cond(result.status, "Failed")["reason"] == "DeadlineExceeded"
    assert remaining_deadline(RunFacts(nodes=1), started, NOW) is None


def test_job_failed_without_pods():
    job = batch_job(conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])
    result = assess(FACTS, job, [], None, NOW)
    assert result.phase == "Restarting"
    assert result.status["lastFailure"]["reason"] == "BackoffLimitExceeded"


def test_user_suspend_is_propagated_and_shown():
    facts = RunFacts(nodes=2, suspend=True)
    running = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)
    assert running.action is Action.SUSPEND_JOB
    suspended = assess(facts, batch_job(suspend=True), [], None, NOW)
    assert suspended.phase == "Suspended"
    assert cond(suspended.status, "Suspended")["status"] == "True"
    assert suspended.action is Action.NONE


def test_resume_without_kueue_unsuspends():
    result = assess(RunFacts(nodes=2), batch_job(suspend=True), [], None, NOW)
    assert result.action is Action.RESUME_JOB
    assert result.phase == "Pending"


def test_kueue_queued_and_never_resumed_by_the_operator():
    facts = RunFacts(nodes=2, queue_name="gpu-queue")
    queued = assess(facts, batch_job(suspend=True), [], None, NOW)
    assert queued.phase == "Queued"
    assert queued.action is Action.NONE
    assert cond(queued.status, "Queued")["status"] == "True"
    admitted = assess(facts, batch_job(suspend=False), [pod(0), pod(1)], queued, NOW)
    assert admitted.phase == "Running"
    assert admitted.action is Action.NONE
    assert cond(admitted.status, "Queued")["status"] == "False"


def test_a_kueue_job_suspended_by_the_user_loses_its_job_not_just_its_pods():
    # Kueue unsuspends a suspended Job whose Workload is admitted: the Job is deleted instead.
    facts = RunFacts(nodes=2, queue_name="gpu-queue", suspend=True)
    running = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)
    assert running.action is Action.STOP_JOB
    assert running.phase == "Suspended"
    assert "Kueue releases its quota" in running.status["message"]
    queued = assess(facts, batch_job(suspend=True), [], None, NOW)
    assert queued.action is Action.STOP_JOB
    going = assess(facts, batch_job(suspend=True, deleting=True), [], running.status, NOW)
    assert (going.phase, going.action) == ("Suspended", Action.NONE)
    gone = assess(facts, None, [], going.status, NOW)
    assert (gone.phase, gone.action) == ("Suspended", Action.NONE)  # no Job is created while suspended
    assert cond(gone.status, "Suspended")["status"] == "True"
    resumed = assess(RunFacts(nodes=2, queue_name="gpu-queue"), None, [], gone.status, NOW)
    assert resumed.action is Action.CREATE_JOB


def kueue_job(queue_label: str | None = None, **kwargs: Any) -> dict:
    job = batch_job(suspend=True, **kwargs)
    if queue_label:
        job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue_label}
    return job


def workload(*conditions: tuple[str, str, str, str], owner: str = JOB_UID, cluster_queue: str | None = None) -> dict:
    view: dict[str, Any] = {
        "metadata": {"name": f"job-demo-{owner[-5:]}", "ownerReferences": [{"uid": owner, "kind": "Job"}]},
        "status": {
            "conditions": [dict(zip(("type", "status", "reason", "message"), c, strict=True)) for c in conditions]
        },
    }
    if cluster_queue:
        view["status"]["admission"] = {"clusterQueue": cluster_queue}
    return view


def queued_condition(facts: RunFacts, *workloads: dict, previous: dict | None = None) -> dict:
    return cond(assess(facts, kueue_job(), [], previous, NOW, workloads=list(workloads)).status, "Queued")


def test_kueue_queued_says_why_from_the_workload():
    facts = RunFacts(nodes=2, queue_name="gpu-queue")
    assert queued_condition(facts)["reason"] == "WaitingForWorkload"
    # A predecessor's Workload is not this Job's.
    assert queued_condition(facts, workload(owner="old-job"))["reason"] == "WaitingForWorkload"
    assert queued_condition(facts, workload())["reason"] == "WaitingForScheduling"
    quota = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gpu"
    pending = assess(
        facts, kueue_job(), [], None, NOW, workloads=[workload(("QuotaReserved", "False", "Pending", quota))]
    )
    queued = cond(pending.status, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForQuota")
    assert quota in queued["message"] and "job-demo-uid-1" in queued["message"]
    assert pending.status["message"].startswith("queued in Kueue queue gpu-queue: ")
    missing = workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue gpu-queue doesn't exist"))
    assert queued_condition(facts, missing)["reason"] == "Inadmissible"
    checks = queued_condition(facts, workload(("QuotaReserved", "True", "QuotaReserved", ""), cluster_queue="cq"))
    assert checks["reason"] == "WaitingForAdmissionChecks" and "cq" in checks["message"]


def test_kueue_preemption_queues_again_and_says_so():
    facts = RunFacts(nodes=2, queue_name="gpu-queue")
    running = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)
    preempted = workload(
        ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization"),
        ("QuotaReserved", "False", "Pending", "Preempted to accommodate a workload (UID: x) due to prioritization"),
    )
    # Kueue suspends the Job: its pods go, and that is no failure.
    result = assess(facts, kueue_job(), [failed(0), failed(1)], running.status, NOW, workloads=[preempted])
    assert result.phase == "Queued"
    assert result.action is Action.NONE
    assert result.status.get("restarts", 0) == 0
    queued = cond(result.status, "Queued")
    assert queued["reason"] == "Evicted"
    assert "evicted (Preempted): Preempted to accommodate" in queued["message"]
    assert result.status["message"].startswith("queued again in Kueue queue gpu-queue: ")


def test_kueue_requeue_after_a_gang_restart_is_said_plainly():
    facts = RunFacts(nodes=2, queue_name="gpu-queue")
    previous = {
        "phase": "Restarting",
        "startTime": "2026-01-02T03:00:00Z",
        "restarts": 1,
        "lastFailure": {"reason": "Error", "message": "boom", "jobUid": "old-job"},
    }
    pending = workload(("QuotaReserved", "False", "Pending", "insufficient unused quota"))
    result = assess(facts, kueue_job(), [], previous, NOW, workloads=[pending])
    assert result.phase == "Queued"
    assert result.status["message"].startswith("queued again after the gang restart in Kueue queue gpu-queue")


def test_a_new_job_waits_until_the_previous_jobs_workload_is_gone():
    # Kueue matches Workloads to Jobs by name: the replacement would inherit the old admission.
    facts = RunFacts(nodes=2, queue_name="gpu-queue")
    previous = {"phase": "Restarting", "lastFailure": {"reason": "Error", "message": "boom", "jobUid": "old-job"}}
    old = workload(("Admitted", "True", "Admitted", ""), owner="old-job")
    waiting = assess(facts, None, [], previous, NOW, workloads=[old])
    assert (waiting.phase, waiting.action) == ("Restarting", Action.NONE)
    assert cond(waiting.status, "Running")["reason"] == "WaitingForWorkloadDeletion"
    assert old["metadata"]["name"] in waiting.status["message"]
    assert assess(facts, None, [], waiting.status, NOW, workloads=[]).action is Action.CREATE_JOB


def test_a_queue_label_from_kueues_default_local_queue_makes_the_job_kueues():
    # No spec.scheduling.queueName, but Kueue's webhook labelled and suspended the Job: never resume it.
    result = assess(RunFacts(nodes=2), kueue_job(queue_label="default"), [], None, NOW)
    assert result.phase == "Queued"
    assert result.action is Action.NONE
    suspended = assess(RunFacts(nodes=2, suspend=True), kueue_job(queue_label="default"), [], None, NOW)
    assert suspended.action is Action.STOP_JOB


def held_by_kueue(asked: str) -> dict:
    """A Job Kueue's webhook suspended (manageJobsWithoutQueueName), the operator having asked for `asked`."""
    job = kueue_job()
    job["metadata"]["annotations"] = {"colocgrpo.io/suspend-requested": asked}
    return job


def test_a_job_suspended_by_kueue_without_a_queue_name_is_never_resumed_and_says_why():
    # The operator asked for a running Job and finds it suspended: Kueue took it (manageJobsWithoutQueueName).
    inadmissible = workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue  doesn't exist"))
    result = assess(RunFacts(nodes=2), held_by_kueue("false"), [], None, NOW, workloads=[inadmissible])
    assert result.phase == "Queued"
    assert result.action is Action.NONE
    queued = cond(result.status, "Queued")
    assert queued["reason"] == "NoQueueName"
    assert "kueue.x-k8s.io/queue-name" in queued["message"] and "LocalQueue  doesn't exist" in queued["message"]
    # The user's suspend deletes it (Kueue would otherwise start it once admitted).
    assert assess(RunFacts(nodes=2, suspend=True), held_by_kueue("false"), [], None, NOW).action is Action.STOP_JOB
    # A Job the operator itself suspended (the user's suspend, then resume) is resumed as before.
    assert assess(RunFacts(nodes=2), held_by_kueue("true"), [], None, NOW).action is Action.RESUME_JOB
    # A Job of an older operator (no annotation) too.
    assert assess(RunFacts(nodes=2), kueue_job(), [], None, NOW).action is Action.RESUME_JOB


def test_suspended_job_pods_are_not_failures():
    result = assess(RunFacts(nodes=2, suspend=True), batch_job(suspend=True), [failed(0)], None, NOW)
    assert result.phase == "Suspended"
    assert result.status.get("restarts", 0) == 0


def test_stall_detection():
    facts = RunFacts(nodes=2, stall_timeout_seconds=60)
    first = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)
    assert cond(first.status, "Stalled")["status"] == "False"
    progress = {"step": 7, "lastUpdateTime": format_time(NOW)}
    fresh = assess(facts, batch_job(), [pod(0), pod(1)], first, NOW + timedelta(seconds=30), progress)
    assert cond(fresh.status, "Stalled")["status"] == "False"
    stale = assess(facts, batch_job(), [pod(0), pod(1)], fresh, NOW + timedelta(seconds=61), progress)
    stalled = cond(stale.status, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "Stalled"
    assert "step 7" in stalled["message"]
    assert stale.phase == "Running"
    moving = dict(progress, step=8, lastUpdateTime=format_time(NOW + timedelta(seconds=62)))
    recovered = assess(facts, batch_job(), [pod(0), pod(1)], stale, NOW + timedelta(seconds=63), moving)
    assert cond(recovered.status, "Stalled")["status"] == "False"


def test_no_progress_ever_counts_from_running_start():
    facts = RunFacts(nodes=1, stall_timeout_seconds=60)
    first = assess(facts, batch_job(), [pod(0)], None, NOW)
    later = assess(facts, batch_job(), [pod(0)], first, NOW + timedelta(seconds=90))
    assert cond(later.status, "Stalled")["status"] == "True"


def test_a_step_that_stops_moving_restarts_the_gang_after_the_progress_deadline():
    facts = RunFacts(nodes=2, max_restarts=1, progress_deadline_seconds=60)
    first = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)  # the gang runs from NOW
    assert cond(first.status, "Progressing")["reason"] == "WaitingForFirstStep"

    def at(before: Assessment, seconds: float, step_seen: float | None) -> Assessment:
        step_since = NOW + timedelta(seconds=step_seen) if step_seen is not None else None
        return derive(
            facts, batch_job(), [pod(0), pod(1)], before.record, before.status,
            NOW + timedelta(seconds=seconds), {"step": 2}, None, None, step_since,
        )  # fmt: skip

    # The first step is allowed the deadline plus the allowance for loading the model.
    waiting = at(first, 60 + FIRST_STEP_ALLOWANCE_SECONDS - 1, None)
    assert waiting.action is Action.NONE and cond(waiting.status, "Progressing")["status"] == "True"
    # A step seen after the gang started: the deadline counts from it, without the allowance.
    moving = at(first, 100, 50)
    assert cond(moving.status, "Progressing")["reason"] == "StepAdvancing" and moving.phase == "Running"
    assert at(moving, 109, 50).action is Action.NONE
    hung = at(moving, 111, 50)
    progressing = cond(hung.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert "step 2" in progressing["message"]
    assert hung.action is Action.RESTART_GANG and hung.phase == "Restarting" and hung.record.restarts == 1
    assert hung.record.last_failure["reason"] == "ProgressDeadlineExceeded"

    # An operator that starts anew sees step 2 without seeing it move: it counts from then, with a
    # first step's allowance unless this gang's trainer reported already (its lastUpdateTime).
    def restarted(seconds: float, reported: float) -> Assessment:
        progress = {"step": 2, "lastUpdateTime": format_time(NOW + timedelta(seconds=reported))}
        return derive(
            facts, batch_job(), [pod(0), pod(1)], moving.record, moving.status, NOW + timedelta(seconds=seconds),
            progress, None, None, NOW + timedelta(seconds=150), False,
        )  # fmt: skip

    assert restarted(150 + 59, reported=50).action is Action.NONE  # never sooner than the deadline
    assert restarted(150 + 61, reported=50).action is Action.RESTART_GANG  # this gang reached step 2
    before = derive(
        facts, batch_job(), [pod(0), pod(1)], moving.record, dict(moving.status, conditions=[]),
        NOW + timedelta(seconds=150 + 61), {"step": 2, "lastUpdateTime": format_time(NOW - timedelta(seconds=5))},
        None, None, NOW + timedelta(seconds=150), False,
    )  # fmt: skip
    assert before.action is Action.NONE  # a step from before this gang ran: the first-step allowance
    # The same Job judged again is not counted again; a second hung gang is past maxRestarts.
    assert at(hung, 112, 50).record.restarts == 1
    gang = batch_job(uid="job-uid-2"), [pod(0, uid="job-uid-2"), pod(1, uid="job-uid-2")]

    def second(before: Assessment, seconds: float, step_seen: float) -> Assessment:
        return derive(
            facts, *gang, before.record, before.status, NOW + timedelta(seconds=seconds), {"step": 3}, None, None,
            NOW + timedelta(seconds=step_seen),
        )  # fmt: skip

    # The new gang runs from 200 s: step 2, last seen before that, is its first step again.
    started = second(hung, 200, 50)
    assert started.phase == "Running" and cond(started.status, "Progressing")["reason"] == "WaitingForFirstStep"
    again = second(second(started, 210, 205), 266, 205)
    assert again.phase == "Failed" and cond(again.status, "Failed")["reason"] == "MaxRestartsExceeded"


def test_the_step_clock_knows_a_move_from_a_first_sight():
    from colocgrpo_operator.controller.progress_clock import StepClock

    clock, key = StepClock(), ("ns", "j")
    job = {"metadata": {"uid": "u1"}, "status": {"progress": {"step": 2}}}
    assert clock.observe(key, job, NOW) == (NOW, False)  # first sight: when it got there is unknown
    assert clock.observe(key, job, NOW + timedelta(seconds=5)) == (NOW, False)
    moved = {"metadata": {"uid": "u1"}, "status": {"progress": {"step": 3}}}
    assert clock.observe(key, moved, NOW + timedelta(seconds=9)) == (NOW + timedelta(seconds=9), True)
    other = {"metadata": {"uid": "u2"}, "status": {"progress": {"step": 3}}}  # a new incarnation
    assert clock.observe(key, other, NOW + timedelta(seconds=10)) == (NOW + timedelta(seconds=10), False)
    assert clock.observe(key, {"metadata": {"uid": "u2"}}, NOW) == (None, False)


def test_the_progress_deadline_can_be_turned_off():
    facts = RunFacts(nodes=1, progress_deadline_seconds=0)
    first = assess(facts, batch_job(), [pod(0)], None, NOW)
    later = derive(facts, batch_job(), [pod(0)], first.record, first.status, NOW + timedelta(days=30), {"step": 1})
    assert later.action is Action.NONE and condition_of(later.status, "Progressing") is None


def test_progress_is_never_written():
    previous = {"phase": "Running", "progress": {"step": 3}}
    result = derive(FACTS, batch_job(), [pod(0), pod(1)], Record(), previous, NOW, previous["progress"])
    assert "progress" not in result.status


def test_invalid_spec_status_names_fields_and_revives_when_fixed():
    status = invalid_spec_status(Record(), None, [("spec.vllm.tensorParallelSize", "must divide gpusPerNode")], NOW, 1)
    assert status["phase"] == "Failed"
    assert cond(status, "SpecValid")["reason"] == "InvalidSpec"
    assert "spec.vllm.tensorParallelSize" in cond(status, "SpecValid")["message"]
    assert status["workers"] == {"active": 0, "ready": 0, "succeeded": 0, "failed": 0, "gpus": 0}  # GPUs column: 0
    fixed = derive(RunFacts(nodes=1, generation=2), None, [], Record(), status, NOW)
    assert fixed.phase == "Pending"
    assert fixed.action is Action.CREATE_JOB
    assert cond(fixed.status, "SpecValid")["status"] == "True"
    assert cond(fixed.status, "Failed")["status"] == "False"


def test_transition_time_moves_only_on_flip():
    conditions = set_condition([], "Running", False, "A", "m", NOW)
    same = set_condition(conditions, "Running", False, "B", "other", NOW + timedelta(minutes=1))
    assert same[0]["lastTransitionTime"] == format_time(NOW)
    assert same[0]["reason"] == "B"
    flipped = set_condition(same, "Running", True, "C", "m", NOW + timedelta(minutes=2))
    assert flipped[0]["lastTransitionTime"] == format_time(NOW + timedelta(minutes=2))


def test_reassessing_an_unchanged_world_changes_nothing():
    first = assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW)
    second = assess(FACTS, batch_job(), [pod(0), pod(1)], first, NOW + timedelta(seconds=30))
    assert first.status == second.status
    assert first.record == second.record


def test_reason_from_text_helper():
    assert reason_from_termination_message("")[0] is None
    assert reason_from_termination_message('{"reason": "VLLMError", "message": "engine died"}') == (
        "VLLMError",
        "engine died",
    )


# --- property: any garbage in, a well-formed status out --------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
k8s_like = st.dictionaries(
    st.sampled_from(["metadata", "spec", "status"]),
    st.dictionaries(
        st.sampled_from(
            [
                "uid",
                "suspend",
                "conditions",
                "phase",
                "containerStatuses",
                "ownerReferences",
                "deletionTimestamp",
                "startTime",
                "labels",
                "lastFailure",
                "restarts",
            ]
        ),
        json_values,
        max_size=5,
    ),
    max_size=3,
)

RECORD_KEYS = ["restarts", "disruptions", "startTime", "completionTime", "lastFailure", "outcome"]


@settings(max_examples=600, deadline=None)
@example(job=None, pods=[], previous={"phase": []}, record=None, progress=None, nodes=1, restarts=0)  # unhashable
@example(job=None, pods=[], previous={"conditions": True}, record=None, progress=None, nodes=1, restarts=0)
@given(
    job=st.none() | k8s_like,
    pods=st.lists(k8s_like, max_size=4),
    previous=st.none() | json_values,
    record=json_values | st.dictionaries(st.sampled_from(RECORD_KEYS), json_values, max_size=4),
    progress=st.none() | json_values,
    nodes=st.integers(1, 4),
    restarts=st.integers(0, 3),
)
def test_garbage_never_crashes(job, pods, previous, record, progress, nodes, restarts):
    previous = previous if isinstance(previous, dict) else None
    progress = progress if isinstance(progress, dict) else None
    result = derive(
        RunFacts(nodes=nodes, max_restarts=restarts, stall_timeout_seconds=5),
        job,
        pods,
        Record.decode(json.dumps(record)),
        previous,
        NOW,
        progress,
    )
    assert result.status["phase"] in {phase.value for phase in Phase}  # the CRD's enum (tests/api/test_crd.py)
    assert "progress" not in result.status
    json.dumps(result.status)


def test_pods_deleted_on_purpose_are_not_failures():
    # A suspended-then-resumed Job: the pod killed by the suspension lingers as Failed (exit 143).
    killed = failed(0, exit_code=143)
    killed["metadata"]["deletionTimestamp"] = "2026-01-02T03:02:00Z"
    result = assess(RunFacts(nodes=1), batch_job(), [killed, pod(0)], None, NOW)
    assert result.phase == "Running"
    assert result.action is Action.NONE


def test_deleted_pod_counts_when_the_job_itself_failed():
    killed = failed(0, exit_code=143)
    killed["metadata"]["deletionTimestamp"] = "2026-01-02T03:02:00Z"
    job = batch_job(conditions=[{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}])
    result = assess(RunFacts(nodes=1, max_restarts=1), job, [killed], None, NOW)
    assert result.action is Action.RESTART_GANG
    assert result.status["restarts"] == 1


def test_oom_first_then_job_controller_deletes_the_rest_is_counted():
    cause = failed(0, reason="OOMKilled", exit_code=137, finished="2026-01-02T03:01:00Z")
    deleted = failed(
        1,
        exit_code=143,
        finished="2026-01-02T03:01:30Z",
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "lastTransitionTime": "2026-01-02T03:01:20Z",
            }
        ],
    )
    deleted["metadata"]["deletionTimestamp"] = "2026-01-02T03:01:10Z"
    job = batch_job(conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])
    result = assess(FACTS, job, [deleted, cause], None, NOW)
    assert result.status["lastFailure"]["reason"] == "OOMKilled"
    assert result.status["restarts"] == 1


def test_workers_completing_before_the_job_says_complete_are_still_running():
    result = assess(FACTS, batch_job(), [pod(0, "Succeeded"), pod(1)], None, NOW)
    assert result.phase == "Running"
    assert cond(result.status, "Running")["reason"] == "Finishing"
    all_done = assess(FACTS, batch_job(), [pod(0, "Succeeded"), pod(1, "Succeeded")], None, NOW)
    assert all_done.phase == "Running"


def test_a_rank_whose_container_exited_0_before_its_pod_says_succeeded_is_finishing_not_starting():
    # A real kubelet reports the container's exit before the pod's phase: the rank has finished.
    exited = pod(1, terminated={"exitCode": 0, "reason": "Completed", "finishedAt": "2026-01-02T03:02:00Z"})
    running = assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW)
    result = assess(FACTS, batch_job(), [pod(0, "Succeeded"), exited], running, NOW)
    assert result.phase == "Running"
    assert cond(result.status, "Running")["reason"] == "Finishing"
    assert result.status["message"].startswith("2/2 workers completed")
    # An exit that is not 0 is no finished rank.
    crashed = pod(1, terminated={"exitCode": 3, "reason": "Error", "finishedAt": "2026-01-02T03:02:00Z"})
    assert (
        cond(assess(FACTS, batch_job(), [pod(0, "Succeeded"), crashed], running, NOW).status, "Running")["reason"]
        != "Finishing"
    )


def test_ttl_follows_the_record_and_the_batch_job_never_the_status():
    from colocgrpo_operator.controller.housekeeping import ttl_deadline

    done = Record(completion_time="2026-01-02T03:04:05Z", outcome=SUCCEEDED_OUTCOME)
    for phase in ([], {}, None, 3, "Succeeded", "Failed"):
        cr = {
            "metadata": {"uid": "cr-uid"},
            "status": {"phase": phase, "completionTime": "2020-01-01T00:00:00Z"},
            "spec": {"runPolicy": {"ttlSecondsAfterFinished": 60}},
        }
        # A status that says finished (forged, or stale) starts no TTL without the operator's record.
        assert ttl_deadline(cr, None, None) is None
        assert ttl_deadline(cr, Record(restarts=1), None) is None
        # The record's completion time counts, not the status'.
        assert ttl_deadline(cr, done, None) == datetime(2026, 1, 2, 3, 5, 5, tzinfo=UTC)
        # Not while the job's batch Job is still running, whatever the record says.
        running = batch_job(uid="job-uid")
        running["metadata"]["ownerReferences"] = [{"uid": "cr-uid"}]
        assert ttl_deadline(cr, done, running) is None
        finished = batch_job(uid="job-uid", conditions=[{"type": "Complete", "status": "True"}])
        finished["metadata"]["ownerReferences"] = [{"uid": "cr-uid"}]
        assert ttl_deadline(cr, done, finished) is not None


SUCCEEDED_OUTCOME = Outcome("Succeeded", "Completed", "training completed", "Completed", "all workers completed")


# --- the status is written by others too: nothing in it is read back as the truth -------------


def test_a_forged_terminal_phase_is_not_kept_while_the_gang_runs():
    running = assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW)
    for forged_phase in ("Succeeded", "Failed"):
        forged = dict(running.status, phase=forged_phase, completionTime=format_time(NOW - timedelta(days=1)))
        again = derive(FACTS, batch_job(), [pod(0), pod(1)], running.record, forged, NOW)
        assert again.phase == "Running"
        assert "completionTime" not in again.status
        assert again.record.outcome is None
        # ... and a later failure of the gang restarts it, recorded as usual.
        failure = derive(FACTS, batch_job(), [failed(0), pod(1)], again.record, forged, NOW)
        assert failure.action is Action.RESTART_GANG
        assert failure.status["lastFailure"]["jobUid"] == JOB_UID


def test_forged_counters_and_times_do_not_get_around_max_restarts_or_the_deadline():
    facts = RunFacts(nodes=2, max_restarts=1, active_deadline_seconds=600, generation=1)
    first = assess(facts, batch_job(uid="a"), [failed(0, uid="a")], None, NOW)
    assert first.record.restarts == 1
    forged = dict(first.status, restarts=0, startTime=format_time(NOW + timedelta(days=1)), lastFailure=None)
    gone = derive(facts, None, [], first.record, forged, NOW + timedelta(seconds=700))
    assert gone.phase == "Failed"  # the deadline counts from the recorded start (the Job's own startTime)
    assert cond(gone.status, "Failed")["reason"] == "DeadlineExceeded"
    second = derive(facts, batch_job(uid="b"), [failed(0, uid="b")], first.record, forged, NOW)
    assert second.phase == "Failed"
    assert cond(second.status, "Failed")["reason"] == "MaxRestartsExceeded"


def test_a_recorded_outcome_stands_without_children_and_shows_the_record():
    done = assess(FACTS, batch_job(conditions=[{"type": "Complete", "status": "True"}]), [], None, NOW)
    assert done.record.outcome is not None and done.record.outcome.phase == "Succeeded"
    forged = dict(done.status, phase="Running", restarts=7)
    later = derive(FACTS, None, [], done.record, forged, NOW + timedelta(hours=1))
    assert later.phase == "Succeeded"
    assert later.action is Action.NONE
    assert later.status["restarts"] == 0
    assert later.status["completionTime"] == done.status["completionTime"]
    assert cond(later.status, "Succeeded")["status"] == "True"


def test_a_transition_time_in_the_future_is_not_kept():
    facts = RunFacts(nodes=2, stall_timeout_seconds=60)
    first = assess(facts, batch_job(), [pod(0), pod(1)], None, NOW)
    future = format_time(NOW + timedelta(days=365))
    forged = dict(
        first.status,
        conditions=[
            dict(c, lastTransitionTime=future) if c["type"] == "Running" else c for c in first.status["conditions"]
        ],
    )
    repaired = derive(facts, batch_job(), [pod(0), pod(1)], first.record, forged, NOW + timedelta(seconds=30))
    assert cond(repaired.status, "Running")["lastTransitionTime"] == format_time(NOW + timedelta(seconds=30))
    later = derive(facts, batch_job(), [pod(0), pod(1)], first.record, repaired.status, NOW + timedelta(seconds=100))
    assert cond(later.status, "Stalled")["status"] == "True"


def test_record_round_trips_and_survives_garbage():
    done = assess(FACTS, batch_job(conditions=[{"type": "Complete", "status": "True"}]), [], None, NOW).record
    assert Record.decode(done.encode()) == done
    assert Record.decode("not json") == Record()
    assert Record.decode('{"restarts": -3, "startTime": 5, "outcome": {"phase": "Running"}}') == Record()


def test_an_earlier_operators_status_becomes_the_record_once():
    failed_status = assess(
        FACTS, batch_job(uid="x"), [failed(0, uid="x", message='{"reason": "DataError"}')], None, NOW
    )
    migrated = Record.from_status(failed_status.status)
    assert migrated == failed_status.record
    running = assess(FACTS, batch_job(), [pod(0), pod(1)], None, NOW)
    assert Record.from_status(running.status) == running.record
    invalid = invalid_spec_status(Record(), None, [("spec.model", "missing")], NOW, 1)
    assert Record.from_status(invalid).outcome is None  # an invalid spec is not an outcome: fixing it revives the job
