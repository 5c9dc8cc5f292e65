"""The progress reporter against a real kube-apiserver: it patches only status.progress,
rate-limits, always sends the final step, and survives an unreachable API."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from colocgrpo_training.config import JobRef, ProgressSettings
from colocgrpo_training.progress import GROUP, PLURAL, VERSION, ProgressReporter, StatusPatcher, progress_metrics
from support.shared_stream import lines_written_together

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "charts" / "colocgrpo-operator" / "crds" / "colocgrpojobs.colocgrpo.io.yaml"
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"


def trainer_state(step: int, max_steps: int):
    from transformers import TrainerState

    return TrainerState(global_step=step, max_steps=max_steps)


def training_args(tmp_path):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")


def example_job() -> dict:
    if EXAMPLE.exists():
        docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if isinstance(d, dict)]
        return next(d for d in docs if d.get("kind") == "ColocGRPOJob")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ColocGRPOJob",
        "metadata": {"name": "tiny-cpu"},
        "spec": {
            "model": {"name": "/models/tiny", "dtype": "float32"},
            "dataset": {"name": "/data/train.jsonl"},
            "resources": {"gpusPerNode": 0},
            "rewards": [{"function": "format"}],
        },
    }


@pytest.fixture
def custom_objects(kube_cluster):
    from kubernetes import client

    kube_cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}")
    return client.CustomObjectsApi(kube_cluster.api_client)


@pytest.fixture
def job_ref(custom_objects, namespace) -> JobRef:
    body = example_job()
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace}
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return JobRef(name=body["metadata"]["name"], namespace=namespace)


def read_status(custom_objects, job: JobRef) -> dict:
    obj = custom_objects.get_namespaced_custom_object(GROUP, VERSION, job.namespace, PLURAL, job.name)
    return obj.get("status") or {}


def test_patch_writes_progress_and_keeps_the_operators_status(custom_objects, job_ref):
    # The operator owns phase/conditions; a merge patch of status.progress must leave them alone.
    custom_objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, job_ref.namespace, PLURAL, job_ref.name, {"status": {"phase": "Running"}}
    )
    patcher = StatusPatcher(job_ref, custom_objects)
    progress = {
        "step": 3,
        "maxSteps": 10,
        "metrics": {"reward": 0.25, "kl": 0.01, "loss": 0.5, "completion_length": 7.5, "step_time_seconds": 1.2},
        "lastUpdateTime": "2026-12-02T10:00:00Z",
        "lastCheckpoint": "/checkpoints/tiny/checkpoint-3",
    }
    assert patcher.patch(progress) is True
    status = read_status(custom_objects, job_ref)
    assert status["phase"] == "Running"
    assert status["progress"] == progress


def test_patch_bound_to_a_uid_writes_only_that_incarnation(custom_objects, job_ref):
    # The config the operator renders names the job's uid: the patch tests it first, so a trainer
    # of a deleted job writes nothing on a new job of the same name.
    obj = custom_objects.get_namespaced_custom_object(GROUP, VERSION, job_ref.namespace, PLURAL, job_ref.name)
    custom_objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, job_ref.namespace, PLURAL, job_ref.name, {"status": {"phase": "Running"}}
    )
    this = JobRef(name=job_ref.name, namespace=job_ref.namespace, uid=obj["metadata"]["uid"])
    other = JobRef(name=job_ref.name, namespace=job_ref.namespace, uid="uid-of-a-deleted-job")
    assert StatusPatcher(this, custom_objects).patch({"step": 2}) is True
    refused = StatusPatcher(other, custom_objects)
    assert refused.patch({"step": 916}) is False and refused.failures == 1
    status = read_status(custom_objects, job_ref)
    assert status["progress"] == {"step": 2} and status["phase"] == "Running"


def test_reporter_uses_kubeconfig_rate_limits_and_always_sends_the_final_step(
    custom_objects, job_ref, kube_cluster, monkeypatch, tmp_path
):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    stream = io.StringIO()
    reporter = ProgressReporter.from_settings(job_ref, ProgressSettings(min_interval_seconds=3600))
    assert reporter.patcher is not None, "KUBECONFIG should give the reporter an API client"
    reporter.stream = stream
    args = training_args(tmp_path)
    logs = {"loss": 0.5, "reward": 0.1, "kl": 0.0, "completions/mean_length": 8.0, "rewards/format_reward/mean": 0.0}

    reporter.on_log(args, trainer_state(1, 3), None, logs=logs)
    assert reporter.flush(10)
    assert read_status(custom_objects, job_ref)["progress"]["step"] == 1

    reporter.on_log(args, trainer_state(2, 3), None, logs={**logs, "reward": 0.2})
    assert reporter.flush(10)
    assert read_status(custom_objects, job_ref)["progress"]["step"] == 1  # within min_interval: printed only

    reporter.on_save(args, trainer_state(3, 3), None)
    reporter.on_log(args, trainer_state(3, 3), None, logs={**logs, "reward": 0.3})
    assert reporter.flush(10)
    progress = read_status(custom_objects, job_ref)["progress"]
    assert progress["step"] == 3 and progress["maxSteps"] == 3  # the final step always goes out
    assert progress["metrics"]["reward"] == 0.3
    assert progress["metrics"]["completion_length"] == 8.0
    assert progress["lastCheckpoint"].endswith("checkpoint-3")
    assert reporter.patches_sent == 2

    printed = [json.loads(line)["progress"] for line in stream.getvalue().splitlines()]
    assert [p["step"] for p in printed] == [1, 2, 3, 3]  # every report is printed, patched or not


def test_unreachable_api_never_stops_training(tmp_path):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    api = client.CustomObjectsApi(client.ApiClient(configuration))
    stream = io.StringIO()
    patcher = StatusPatcher(JobRef(name="j", namespace="n"), api)
    reporter = ProgressReporter(
        JobRef(name="j", namespace="n"), ProgressSettings(min_interval_seconds=0), patcher, stream
    )

    reporter.on_log(training_args(tmp_path), trainer_state(1, 2), None, logs={"loss": 1.0})
    assert reporter.flush(15)
    assert patcher.failures == 1 and not patcher.can_try()  # backing off
    reporter.on_log(training_args(tmp_path), trainer_state(2, 2), None, logs={"loss": 0.9})
    assert reporter.flush(15)
    assert patcher.failures == 2  # the final step is tried even while backing off
    assert len(stream.getvalue().splitlines()) == 2  # still printed


def test_a_black_holed_api_does_not_block_the_training_step(tmp_path):
    """A server that accepts connections and never answers: on_log must return at once."""
    import socket
    import time

    from kubernetes import client

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        patcher = StatusPatcher(
            JobRef(name="j", namespace="n"), client.CustomObjectsApi(client.ApiClient(configuration))
        )
        reporter = ProgressReporter(
            JobRef(name="j", namespace="n"), ProgressSettings(min_interval_seconds=0), patcher, io.StringIO()
        )
        started = time.monotonic()
        for step in (1, 2, 3):
            reporter.on_log(training_args(tmp_path), trainer_state(step, 10), None, logs={"loss": 1.0})
        assert time.monotonic() - started < 2  # the patch request itself waits up to 10 s, off-thread
    finally:
        silent.close()


def test_metrics_mapping_drops_nan_and_non_numbers():
    logs = {"reward": float("nan"), "loss": 0.5, "completions/mean_length": 4, "epoch": 1.0, "note": "x", "kl": True}
    assert progress_metrics(logs) == {"loss": 0.5, "completion_length": 4.0}


def test_reporter_is_silent_off_rank_zero(tmp_path):
    stream = io.StringIO()
    reporter = ProgressReporter(JobRef(name="j", namespace="n"), ProgressSettings(), None, stream)
    state = trainer_state(1, 2)
    state.is_world_process_zero = False
    reporter.on_log(training_args(tmp_path), state, None, logs={"loss": 1.0})
    assert stream.getvalue() == ""


def test_estimate_percent_and_time_left():
    from colocgrpo_training.progress import estimate

    assert estimate(0, 0, 0, 0) == (None, None)  # max_steps unknown
    assert estimate(0, 10, 0, 0.0) == (0, None)  # no step run yet: no pace
    assert estimate(3, 7, 3, 30.0) == (42, 40)  # 10 s a step, 4 left; 300/7 rounded down
    assert estimate(10, 10, 10, 5.0) == (100, 0)
    assert estimate(12, 10, 2, 5.0) == (100, 0)


def test_reporter_publishes_percent_eta_reward_history_and_vllm_totals(custom_objects, job_ref, tmp_path):
    """A resumed run (from step 4) at 5 s a step: the pace counts only this process's steps, and the patch the
    real apiserver stores carries every new field."""
    import datetime as dt

    now = [100.0]
    patcher = StatusPatcher(job_ref, custom_objects)
    reporter = ProgressReporter(
        job_ref, ProgressSettings(min_interval_seconds=0), patcher, io.StringIO(), clock=lambda: now[0]
    )
    args = training_args(tmp_path)
    totals = {
        "generation/sleep_seconds": 1.5,
        "generation/wake_seconds": 2.0,
        "generation/push_seconds": 0.25,
        "generation/generate_seconds": 12.0,
        "generation/pushes": 3.0,  # counters that are not times stay out of the status
    }
    for step, reward in ((4, 0.1), (5, 0.2), (6, 0.3)):
        reporter.on_step_begin(args, trainer_state(step, 10), None)
        now[0] += 5
        reporter.on_step_end(args, trainer_state(step + 1, 10), None)
        reporter.on_log(args, trainer_state(step + 1, 10), None, logs={"reward": reward, "loss": 0.1, **totals})
    assert reporter.flush(10)
    progress = read_status(custom_objects, job_ref)["progress"]
    assert (progress["step"], progress["percent"], progress["estimatedRemainingSeconds"]) == (7, 70, 15)
    updated = dt.datetime.fromisoformat(progress["lastUpdateTime"].replace("Z", "+00:00"))
    eta = dt.datetime.fromisoformat(progress["estimatedCompletionTime"].replace("Z", "+00:00"))
    assert eta - updated == dt.timedelta(seconds=15)
    assert progress["rewardHistory"] == [0.1, 0.2, 0.3]
    metrics = progress["metrics"]
    assert (metrics["sleep_seconds_total"], metrics["wake_seconds_total"], metrics["push_seconds_total"]) == (
        1.5,
        2.0,
        0.25,
    )
    assert metrics["generate_seconds_total"] == 12.0 and "pushes" not in str(metrics)
    assert metrics["step_time_seconds"] == 5.0


def test_reward_history_keeps_the_latest_forty(tmp_path):
    reporter = ProgressReporter(JobRef(name="j", namespace="n"), ProgressSettings(), None, io.StringIO())
    for step in range(1, 46):
        reporter.on_log(training_args(tmp_path), trainer_state(step, 100), None, logs={"reward": step / 100})
    assert reporter.reward_history == [step / 100 for step in range(6, 46)]
    assert reporter.snapshot(trainer_state(45, 100))["rewardHistory"][-1] == 0.45


# Rank 0's progress lines and every rank's stop lines, as the ranks of a pod write them to the stdout they share.
PROGRESS_WRITER = """
import sys
from transformers import TrainerState
from colocgrpo_training.config import JobRef, ProgressSettings
from colocgrpo_training.progress import ProgressReporter
reporter = ProgressReporter(JobRef(name="j", namespace="n"), ProgressSettings(), None, sys.stdout)
reporter.reward_history.extend([0.5] * 40)
print("ready", file=sys.stderr, flush=True)
sys.stdin.read()  # the test's start signal: both writers begin together
for step in range(1, 401):
    reporter.report(TrainerState(global_step=step, max_steps=400), final=False)
"""
STOP_WRITER = """
import sys
from colocgrpo_training.console import say_line
print("ready", file=sys.stderr, flush=True)
sys.stdin.read()  # the start signal
for step in range(400):
    say_line(f"colocgrpo: stopped by signal 15 at step {step}; checkpoint " + "c" * 300 + " saved")
"""


def test_progress_lines_never_merge_with_other_ranks_lines_on_the_shared_stdout() -> None:
    """Rank 0's reporter and another rank write 400 lines each into one pipe, unbuffered as the pods run them, from a
    common start: every line comes out whole (with print, a progress line and its newline are two writes, and another
    rank's stop line can land between them)."""
    lines = lines_written_together([PROGRESS_WRITER, STOP_WRITER], "stdout")
    stops = [line for line in lines if line.startswith("colocgrpo: stopped by")]
    progress = [line for line in lines if not line.startswith("colocgrpo: stopped by")]
    expected = [f"colocgrpo: stopped by signal 15 at step {s}; checkpoint " + "c" * 300 + " saved" for s in range(400)]
    assert stops == expected
    assert [json.loads(line)["progress"]["step"] for line in progress] == list(range(1, 401))
