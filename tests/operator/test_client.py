"""The Python client (`colocgrpo_operator.client`) against the real local control plane and the operator:
a job built from the typed model is submitted, waited for, followed, suspended, resumed, listed and deleted;
its logs are read one rank at a time and every rank at once, through a restarted gang. Fake pods are driven
as tests/operator's other tests drive them (colocgrpo_dev.cluster.fake_pods)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from colocgrpo_dev.cluster import drive_pod_failure, drive_pod_success
from colocgrpo_dev.cluster.fake_logs import append_fake_logs
from colocgrpo_dev.cluster.kwokctl_config import FAKE_LOG_LINES
from colocgrpo_operator.api.model import (
    ColocGRPOJobSpec,
    DatasetSpec,
    ModelSpec,
    ObjectMeta,
    ResourcesSpec,
    RewardSpec,
)
from colocgrpo_operator.client import (
    ColocGRPOClient,
    ColocGRPOJob,
    JobFailed,
    JobFinished,
    JobNotFound,
    JobSpecError,
    NoPodForRank,
    WaitTimeout,
)
from support.operator_harness import running_pod, tiny_job, wait_for, wait_phase

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(kube_cluster, op_namespace):
    with ColocGRPOClient(namespace=op_namespace, kubeconfig=kube_cluster.kubeconfig) as made:
        yield made


def typed_job(name: str, **run_policy) -> ColocGRPOJob:
    """examples/tiny-cpu.yaml's job, built from the typed model as a notebook would."""
    return ColocGRPOJob(
        metadata=ObjectMeta(name=name),
        spec=ColocGRPOJobSpec(
            model=ModelSpec(name="/tmp/colocgrpo-tiny-model", dtype="float32"),
            dataset=DatasetSpec(name="examples/data/arith.jsonl", prompt_column="prompt", solution_column="solution"),
            resources=ResourcesSpec(nodes=1, gpus_per_node=0, cpu="1", memory="2Gi"),
            rewards=[RewardSpec(function="accuracy")],
            trainer_args={"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4},
            run_policy=run_policy,
        ),
    )


class Collector:
    """Iterates in a thread of its own, keeping what it yields (and what it raised)."""

    def __init__(self, iterable):
        self.items: list = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(iterable,), daemon=True)
        self.thread.start()

    def _run(self, iterable):
        try:
            for item in iterable:
                self.items.append(item)
        except BaseException as error:  # reported by the test
            self.error = error

    def until(self, predicate, timeout: float, what: str):
        return wait_for(lambda: predicate(list(self.items)), timeout, what, on_timeout=lambda: repr(self.items[-20:]))

    def finish(self, timeout: float) -> list:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still iterating after {timeout}s; last: {self.items[-10:]!r}"
        if self.error is not None:
            raise self.error
        return self.items


def test_submit_wait_and_follow_the_progress_of_a_typed_job(client, cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    submitted = client.submit(typed_job("typed"))
    assert (submitted.namespace, submitted.name) == (ns, "typed") and submitted.uid
    assert submitted.object["spec"]["runPolicy"]["maxRestarts"] == 3  # stored with the model's defaults

    running = client.wait("typed", "Running", timeout=60)
    assert running.phase == "Running" and running.condition_true("Running")
    progress = Collector(client.progress("typed", timeout=120))
    for step in (1, 2):
        report = {
            "step": step,
            "maxSteps": 2,
            "metrics": {"reward": step / 4},
            "lastUpdateTime": f"2026-01-01T00:0{step}:00Z",
        }
        cluster.patch_job(ns, "typed", {"status": {"progress": report}}, subresource="status")
        progress.until(lambda seen, step=step: any(p.step == step for p in seen), 60, f"step {step} seen")
    drive_pod_success(kube_cluster.core_v1, ns, running.status["rank0Pod"])
    done = client.wait("typed", "Succeeded", timeout=60)
    assert done.phase == "Succeeded" and (done.step, done.reward) == (2, 0.5)

    seen = progress.finish(30)  # ends by itself: the job ended
    assert seen[-1].finished and seen[-1].phase == "Succeeded"
    steps = [p.step for p in seen if p.step is not None]
    assert steps == sorted(steps) and {1, 2} <= set(steps)
    assert [p.reward for p in seen if p.step == 2][-1] == 0.5

    def event_reasons() -> set[str]:
        return {str(event.get("reason")) for event in client.events("typed")}

    wait_for(lambda: {"Running", "Succeeded"} <= event_reasons(), 30, "the job's Running and Succeeded Events")


@pytest.mark.slow
def test_following_a_job_outlasts_an_api_server_restart(client, cluster, kube_cluster, operator, op_namespace):
    """A notebook's long follow survives a control-plane restart: the cut watch is read again once the API
    server is back, and the job's outcome still arrives."""
    from colocgrpo_dev.cluster.cluster import has_component, restart_component

    kubeconfig = Path(kube_cluster.kubeconfig)
    if not has_component(kubeconfig, "kube-apiserver"):
        pytest.skip("restarting the API server needs a `colocgrpo-dev cluster` (COLOCGRPO_KUBECONFIG is another)")
    client.submit(tiny_job("patient"))
    pod = running_pod(cluster, op_namespace, "patient")
    following = Collector(client.progress("patient", timeout=300))
    following.until(lambda seen: seen and seen[-1].phase == "Running", 60, "the job followed, Running")
    restart_component(kubeconfig, "kube-apiserver")
    wait_for(lambda: _answers(cluster, op_namespace), 120, "the API server back")
    drive_pod_success(kube_cluster.core_v1, op_namespace, pod["metadata"]["name"])
    seen = following.finish(240)
    assert seen[-1].finished and seen[-1].phase == "Succeeded"
    assert client.wait("patient", "Succeeded", timeout=30).phase == "Succeeded"


def _answers(cluster, namespace: str) -> bool:
    try:
        return cluster.get_job(namespace, "patient") is not None
    except Exception:  # refused, reset, 503 while it starts
        return False


def test_an_invalid_job_is_refused_before_it_is_sent(client, cluster, op_namespace):
    body = tiny_job("bad", resources={"gpusPerNode": 8}, vllm={"tensorParallelSize": 3})
    with pytest.raises(JobSpecError) as refused:
        client.submit(body)
    assert any("tensorParallelSize" in line for line in refused.value.lines())
    assert cluster.get_job(op_namespace, "bad") is None
    dry = client.submit(tiny_job("dry"), dry_run=True)
    assert dry.uid and cluster.get_job(op_namespace, "dry") is None  # checked and defaulted, not stored


def test_wait_reports_a_failure_a_timeout_and_a_missing_job(client, cluster, kube_cluster, operator, op_namespace):
    client.submit(tiny_job("doomed", runPolicy={"maxRestarts": 0}))
    pod = running_pod(cluster, op_namespace, "doomed")
    # The pod runs before the operator has seen it: wait for the status, then time out waiting past it.
    wait_phase(cluster, op_namespace, "doomed", "Running", timeout=60, operator=operator)
    with pytest.raises(WaitTimeout) as late:
        client.wait("doomed", "Succeeded", timeout=1)
    assert late.value.state.phase == "Running"
    drive_pod_failure(kube_cluster.core_v1, op_namespace, pod["metadata"]["name"], exit_code=3, message="boom")
    with pytest.raises(JobFailed) as failed:
        client.wait("doomed", "Succeeded", timeout=60)
    assert failed.value.state.phase == "Failed" and failed.value.state.last_failure
    assert client.wait("doomed", "Failed", timeout=5).condition_true("Failed")
    with pytest.raises(JobNotFound, match=f"ColocGRPOJob {op_namespace}/nothing not found"):
        client.wait("nothing", timeout=5)
    with pytest.raises(ValueError, match="condition must be one of"):
        client.wait("doomed", "Done", timeout=5)


def test_suspend_resume_list_and_delete(client, cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    client.submit(tiny_job("pausable"))
    first = running_pod(cluster, ns, "pausable")
    assert client.suspend("pausable") is True
    assert client.suspend("pausable") is False  # already: nothing to change
    wait_phase(cluster, ns, "pausable", "Suspended", operator=operator)
    wait_for(
        lambda: not [p for p in cluster.pods(ns, "pausable") if not p["metadata"].get("deletionTimestamp")],
        30,
        "no pods",
    )
    assert client.resume("pausable") is True and client.resume("pausable") is False
    second = running_pod(cluster, ns, "pausable", exclude_uid=first["metadata"]["uid"])
    drive_pod_success(kube_cluster.core_v1, ns, second["metadata"]["name"])
    client.wait("pausable", "Succeeded", timeout=60)
    with pytest.raises(JobFinished, match="has already Succeeded: there is nothing to suspend"):
        client.suspend("pausable")
    with pytest.raises(JobFinished, match="a finished job does not resume"):
        client.resume("pausable")

    other = kube_cluster.new_namespace("opt-client-other")
    try:
        client.submit(tiny_job("elsewhere"), namespace=other)
        assert [j.name for j in client.list()] == ["pausable"]
        everywhere = {(j.namespace, j.name) for j in client.list(all_namespaces=True)}
        assert {(ns, "pausable"), (other, "elsewhere")} <= everywhere
    finally:
        kube_cluster.delete_namespace(other)

    gone = client.delete("pausable", wait=True, timeout=60)
    assert gone.name == "pausable" and cluster.get_job(ns, "pausable") is None
    with pytest.raises(JobNotFound):
        client.delete("pausable")


def test_logs_of_one_rank_and_of_every_rank_in_time_order(client, cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    client.submit(tiny_job("duo", resources={"nodes": 2}, checkpoint={"resume": "never"}))
    with pytest.raises(NoPodForRank):
        list(client.logs("duo", rank=7))
    pods = {rank: running_pod(cluster, ns, "duo", index=rank)["metadata"]["name"] for rank in (0, 1)}
    # Rank 1 writes first, so every rank's log merged in time order starts with it.
    kube_cluster.set_fake_logs(ns, pods[1], ["r1 first"], container="trainer")
    time.sleep(0.05)
    kube_cluster.set_fake_logs(ns, pods[0], ["r0 second", "r0 third"], container="trainer")
    wait_for(lambda: list(client.logs("duo", rank=0)) == ["r0 second", "r0 third"], 60, "rank 0's fake log")
    wait_for(lambda: list(client.logs("duo", rank=1)) == ["r1 first"], 60, "rank 1's fake log")
    assert list(client.logs("duo", rank=0, tail=1)) == ["r0 third"]
    merged = [(line.rank, line.text) for line in client.all_logs("duo")]
    assert merged == [(1, "r1 first"), (0, "r0 second"), (0, "r0 third")]


def test_following_every_rank_through_a_gang_restart(client, cluster, kube_cluster, operator, op_namespace):
    ns = op_namespace
    client.submit(
        tiny_job("gang", resources={"nodes": 2}, checkpoint={"resume": "never"}, runPolicy={"maxRestarts": 1})
    )
    first = {rank: running_pod(cluster, ns, "gang", index=rank) for rank in (0, 1)}
    files = {
        rank: kube_cluster.set_fake_logs(ns, pod["metadata"]["name"], [f"rank {rank} starts"], container="trainer")
        for rank, pod in first.items()
    }
    wait_for(lambda: list(client.logs("gang", rank=1)) == ["rank 1 starts"], 60, "rank 1's fake log")
    wait_for(lambda: list(client.logs("gang", rank=0)) == ["rank 0 starts"], 60, "rank 0's fake log")

    follow = Collector(client.all_logs("gang", follow=True))
    texts = lambda seen: [(line.rank, line.text) for line in seen]  # noqa: E731
    follow.until(lambda seen: {(0, "rank 0 starts"), (1, "rank 1 starts")} <= set(texts(seen)), 60, "both ranks")
    append_fake_logs(files[1], ["rank 1 step 1"])
    follow.until(lambda seen: (1, "rank 1 step 1") in texts(seen), 60, "a line appended to rank 1")

    # Rank 0 fails: the operator restarts the whole gang; its new pods are followed from their first line.
    drive_pod_failure(kube_cluster.core_v1, ns, first[0]["metadata"]["name"], exit_code=1, message="boom")
    second = {
        rank: running_pod(cluster, ns, "gang", index=rank, exclude_uid=first[rank]["metadata"]["uid"], timeout=60)
        for rank in (0, 1)
    }
    new_names = {pod["metadata"]["name"] for pod in second.values()}
    follow.until(
        lambda seen: {line.pod for line in seen if line.text == FAKE_LOG_LINES[0]} >= new_names,
        60,
        "the restarted gang's pods followed",
    )
    for pod in second.values():
        drive_pod_success(kube_cluster.core_v1, ns, pod["metadata"]["name"])
    lines = follow.finish(90)  # ends by itself once the job has Succeeded

    notices = [line for line in lines if line.notice]
    old_names = {pod["metadata"]["name"] for pod in first.values()}
    assert any(line.pod == first[0]["metadata"]["name"] and "ended: Failed" in line.text for line in notices), notices
    assert {line.pod for line in notices if "a new pod of rank" in line.text} == new_names
    assert {line.pod for line in notices if "went away" in line.text} >= old_names
    assert {line.rank for line in lines if line.pod in new_names and not line.notice} == {0, 1}
    assert client.get("gang").phase == "Succeeded"
