"""The client's pure readers: a job's state and progress from the API's JSON, kubectl's AGE, the choice of
each rank's pod and the time-ordered merge of a gang's logs. No cluster (the calls: tests/operator/test_client.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from colocgrpo_operator.api import ColocGRPOJob
from colocgrpo_operator.client import JobState, LogLine
from colocgrpo_operator.client.logs import merge_in_time_order, pick_pod, pods_by_rank
from colocgrpo_operator.client.views import age, human_duration
from support.operator_harness import tiny_job


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (599, "9m59s"),
        (600, "10m"),
        (179 * 60 + 59, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 20 * 60, "3h20m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (3 * 86400 + 5 * 3600, "3d5h"),
        (8 * 86400, "8d"),
        (729 * 86400, "729d"),
        (730 * 86400, "2y"),
        (760 * 86400, "2y30d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration_is_kubectls_age(seconds, text):
    assert human_duration(seconds) == text


def test_age_of_a_timestamp():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert age("2026-01-02T03:02:05Z", now) == "2m"
    assert age((now - timedelta(seconds=42)).isoformat(), now) == "42s"
    assert age(None, now) == "" and age("yesterday", now) == ""


def _state(status=None, **spec):
    body = tiny_job("j", **spec)
    body["metadata"].update(namespace="ns", uid="u-1", resourceVersion="7", creationTimestamp="2026-01-02T03:04:05Z")
    if status is not None:
        body["status"] = status
    return JobState(body)


def test_a_job_the_operator_has_not_seen_reads_as_none():
    state = _state()
    assert (state.name, state.namespace, state.uid, state.resource_version) == ("j", "ns", "u-1", "7")
    assert state.created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert state.phase is None and not state.finished and not state.suspended
    assert (state.step, state.max_steps, state.reward, state.restarts) == (None, None, None, 0)
    assert state.conditions == [] and state.condition("Running") is None and not state.condition_true("Running")
    progress = state.progress()
    assert (progress.phase, progress.step, progress.reward, progress.finished) == (None, None, None, False)


def test_a_running_job_reads_its_progress_and_conditions():
    status = {
        "phase": "Running",
        "restarts": 2,
        "conditions": [
            {"type": "Running", "status": "True", "reason": "GangRunning", "message": "", "lastTransitionTime": "x"},
            {"type": "Succeeded", "status": "False", "reason": "NotYet", "message": "", "lastTransitionTime": "x"},
        ],
        "progress": {
            "step": 3,
            "maxSteps": 20,
            "percent": 15,
            "metrics": {"reward": 0.25, "kl": 0.01},
            "rewardHistory": [0.0, 0.25],
            "estimatedRemainingSeconds": 120,
            "lastUpdateTime": "2026-01-02T03:05:00Z",
        },
        "lastFailure": {"reason": "OOMKilled", "pod": "j-0-abc"},
    }
    state = _state(status, runPolicy={"suspend": True})
    assert state.phase == "Running" and state.suspended and not state.finished
    assert (state.step, state.max_steps, state.reward, state.restarts) == (3, 20, 0.25, 2)
    assert state.condition_true("Running") and not state.condition_true("Succeeded")
    assert state.last_failure == {"reason": "OOMKilled", "pod": "j-0-abc"}
    progress = state.progress()
    assert progress.metrics == {"reward": 0.25, "kl": 0.01} and progress.reward_history == (0.0, 0.25)
    assert (progress.percent, progress.estimated_remaining_seconds) == (15, 120)
    assert progress.last_update_time == "2026-01-02T03:05:00Z"
    finished = _state({**status, "phase": "Failed"})
    assert finished.finished and finished.progress().finished


def test_the_typed_model_of_a_stored_job():
    model = _state({"phase": "Running", "restarts": 1}).to_model()
    assert isinstance(model, ColocGRPOJob)
    assert model.name == "j" and model.namespace == "ns" and model.status is not None
    assert model.status.restarts == 1 and model.spec.resources.gpus_per_node == 0


def _pod(name, rank, created, deleting=False):
    meta = {
        "name": name,
        "uid": name,
        "creationTimestamp": created,
        "labels": {"batch.kubernetes.io/job-completion-index": str(rank)},
    }
    if deleting:
        meta["deletionTimestamp"] = created
    return {"metadata": meta, "status": {"phase": "Running"}}


def test_each_rank_reads_its_newest_live_pod():
    pods = [
        _pod("old-0", 0, "2026-01-01T00:00:00Z"),
        _pod("new-0", 0, "2026-01-01T00:05:00Z"),
        _pod("going-1", 1, "2026-01-01T00:09:00Z", deleting=True),
        _pod("live-1", 1, "2026-01-01T00:01:00Z"),
        {"metadata": {"name": "no-rank", "labels": {}}},
    ]
    assert pick_pod(pods, 0)["metadata"]["name"] == "new-0"
    assert pick_pod(pods, 1)["metadata"]["name"] == "live-1"  # a pod being deleted only when no other
    assert pick_pod(pods, 2) is None
    assert {rank: pod["metadata"]["name"] for rank, pod in pods_by_rank(pods).items()} == {0: "new-0", 1: "live-1"}


def test_a_gangs_logs_merge_in_time_order_whatever_the_fractions_length():
    logs = {
        (0, "p0"): ["2026-01-01T00:00:01.5Z step 1", "2026-01-01T00:00:03Z step 2"],
        (1, "p1"): ["2026-01-01T00:00:01.25Z rank one up", "2026-01-01T00:00:02.000000001Z rank one step 1"],
    }
    merged = list(merge_in_time_order(logs))
    assert [(line.rank, line.text) for line in merged] == [
        (1, "rank one up"),
        (0, "step 1"),
        (1, "rank one step 1"),
        (0, "step 2"),
    ]
    assert all(not line.notice for line in merged)


def test_a_log_line_with_its_rank_prefix():
    assert LogLine(3, "p", "hello").prefixed(width=2) == "[rank  3] hello"
    assert LogLine(0, "p", "pod p went away", notice=True).prefixed() == "[rank 0] --- pod p went away"
    assert LogLine(None, "", "ColocGRPOJob deleted", notice=True).prefixed() == "[rank ?] --- ColocGRPOJob deleted"
