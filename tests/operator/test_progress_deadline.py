"""The progress deadline against the real apiserver: a trainer whose step stops moving has its gang
restarted (counted, announced, measured); one that keeps stepping is never touched. The trainers
are stand-ins on this host that report progress the way the trainer does, with its own token."""

from __future__ import annotations

import threading
import time

import pytest

from support.operator_harness import (
    Cluster,
    condition,
    report_progress,
    tiny_job,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster

DEADLINE = 8


def _gang_uid(cluster: Cluster, namespace: str, name: str) -> str | None:
    jobs = [j for j in cluster.batch_jobs(namespace, name) if not j["metadata"].get("deletionTimestamp")]
    return jobs[0]["metadata"]["uid"] if jobs else None


def test_a_step_that_stops_moving_restarts_the_gang_and_a_moving_one_is_left_alone(
    cluster, kube_cluster, operator, op_namespace, tmp_path
):
    ns = op_namespace
    policy = {"progressDeadlineSeconds": DEADLINE, "maxRestarts": 2}
    jobs = {name: cluster.create_job(ns, tiny_job(name, runPolicy=policy)) for name in ("hung", "steady")}
    for name in jobs:
        wait_phase(cluster, ns, name, "Running", operator=operator)
    gangs = {name: _gang_uid(cluster, ns, name) for name in jobs}
    trainers = {}
    for name in jobs:
        (tmp_path / name).mkdir()
        trainers[name] = cluster.as_service_account(ns, f"{name}-trainer", tmp_path / name)

    def report(name: str, step: int) -> None:
        report_progress(trainers[name], ns, name, jobs[name]["metadata"]["uid"], step)

    # The steady trainer steps every second for more than three deadlines.
    stop = threading.Event()

    def steady() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            report("steady", step)
            stop.wait(1)

    stepping = threading.Thread(target=steady, daemon=True)
    began = time.monotonic()
    stepping.start()
    try:
        # The hung trainer reports steps 1 and 2, then nothing: a rank stuck in a collective.
        report("hung", 1)
        time.sleep(1.5)
        report("hung", 2)
        stopped = time.monotonic()
        restarted = wait_for(
            lambda: (obj := cluster.get_job(ns, "hung")) and (obj.get("status") or {}).get("restarts") == 1 and obj,
            DEADLINE + 60,
            "the hung job's gang restarted",
            on_timeout=operator.log_tail,
        )
        assert time.monotonic() - stopped >= DEADLINE - 1  # not before the deadline
        failure = restarted["status"]["lastFailure"]
        assert failure["reason"] == "ProgressDeadlineExceeded" and "step 2" in failure["message"], failure
        assert failure["jobUid"] == gangs["hung"]
        new_gang = wait_for(
            lambda: (uid := _gang_uid(cluster, ns, "hung")) not in (None, gangs["hung"]) and uid,
            60,
            "a new gang for the hung job",
            on_timeout=operator.log_tail,
        )
        events = [
            e
            for e in cluster.events(ns)
            if e.get("reason") == "ProgressDeadlineExceeded" and e["involvedObject"].get("name") == "hung"
        ]
        assert events and events[0]["type"] == "Warning", events
        counted = [
            line
            for line in operator.metrics().splitlines()
            if line.startswith("colocgrpo_progress_deadline_exceeded_total ")
        ]
        assert counted and float(counted[0].split()[-1]) >= 1, counted
        # The new gang's first step is allowed time to load the model: step 2, seen before it
        # started, does not count against it.
        wait_phase(cluster, ns, "hung", "Running", timeout=60, operator=operator)
        assert condition(cluster.get_job(ns, "hung"), "Progressing")["reason"] == "WaitingForFirstStep"
        time.sleep(DEADLINE + 4)
        assert (cluster.get_job(ns, "hung")["status"]).get("restarts") == 1
        assert _gang_uid(cluster, ns, "hung") == new_gang
        # Nothing happens to a job that keeps stepping, however long it runs (here three deadlines).
        time.sleep(max(0.0, 3 * DEADLINE - (time.monotonic() - began)))
    finally:
        stop.set()
        stepping.join(timeout=10)
    steady_now = cluster.get_job(ns, "steady")
    assert steady_now["status"]["phase"] == "Running" and steady_now["status"].get("restarts", 0) == 0
    assert steady_now["status"]["progress"]["step"] >= 2 * DEADLINE  # it kept stepping
    assert condition(steady_now, "Progressing")["reason"] == "StepAdvancing"
    assert _gang_uid(cluster, ns, "steady") == gangs["steady"]
