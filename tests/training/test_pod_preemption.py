"""A preempted pod, through its own command: the pod exits with the code its ranks agreed on, and the operator
calls that a preemption.

A 2-GPU job (vLLM TP 2, DeepSpeed ZeRO-3) rendered by the operator is launched here on CPU over gloo with the
pod's command (`colocgrpo-launch`, `support.local_pod`). After its first logged step the pod's main process gets
SIGTERM, as the kubelet sends it on a preemption: torch's elastic agent passes it to both ranks, which agree on a
step, save one checkpoint and exit 143; the pod command exits 143 too, where `accelerate launch` alone ends with 1.
The operator's status derivation, given that pod as the kubelet reports it (the exit code and the trainer's
termination message), names the failure Preempted and does not count the restart.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from support import rank_probe
from support.local_pod import Launch, cpu_pod_job, launch_pod, progress_steps, read_json_lines, render_pod

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD, TP = 2, 2
LAUNCH_LIMIT_S = 300  # a launch takes well under a minute on two loaded cores; past this it hangs


def _parent(pid: int) -> int:
    """The parent of process `pid` (/proc/PID/stat's fourth field, after the parenthesized name)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def preempted(tmp_path_factory, tiny_model_dir, pod_env) -> Launch:
    work = tmp_path_factory.mktemp("preempted")
    job = cpu_pod_job(
        work,
        tiny_model_dir,
        name="preempted",
        gpus=WORLD,
        tp=TP,
        sleep_policy="level1",
        checkpoint={"path": str(work / "checkpoints")},
        trainer_args={
            "max_steps": 50,  # never reached: the SIGTERM stops it
            "per_device_train_batch_size": 2,
            "num_generations": 4,
            "max_completion_length": 6,
            "logging_steps": 1,
            "seed": 5,
        },
    )
    command = render_pod(job, work / "config", reward_modules_dir=work / "rewards")
    assert Path(command[0]).name == "colocgrpo-launch", command
    env = {
        **pod_env(work),
        rank_probe.DIR_ENV: str(work / "probe"),
        "COLOCGRPO_TERMINATION_LOG": str(work / "termination-log"),
        "PYTHONUNBUFFERED": "1",
    }

    def sigterm_the_pod() -> bool:
        """Once rank 0 logged a step: SIGTERM to the ranks' parent, the pod command's process."""
        builds = [r for r in read_json_lines(work / "probe" / "rank0.jsonl") if r["event"] == "build"]
        if not builds or not progress_steps((work / "stdout.log").read_text(errors="replace")):
            return False
        os.kill(_parent(builds[0]["pid"]), signal.SIGTERM)
        return True

    return launch_pod(
        command, work, env, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=work / "probe", until=sigterm_the_pod
    )


def test_the_pod_command_exits_143_with_its_ranks(preempted):
    assert preempted.returncode == 143, preempted.tail()
    assert "colocgrpo-launch: every rank exited 143" in preempted.stderr, preempted.tail()
    stops = [line for line in preempted.stdout.splitlines() if line.startswith("colocgrpo: stopped by")]
    assert len(stops) == WORLD, preempted.tail()
    message = json.loads((preempted.work / "termination-log").read_text())
    assert message["reason"] == "Terminated"
    (checkpoint,) = (preempted.work / "checkpoints").glob("checkpoint-*")
    assert checkpoint.name in message["message"]


def test_the_operator_calls_the_pod_preempted_and_does_not_count_it(preempted):
    from datetime import UTC, datetime

    from colocgrpo_operator.controller.conditions import condition_of
    from colocgrpo_operator.controller.record import Record
    from colocgrpo_operator.controller.status import Action, RunFacts, assess

    # The pod as the kubelet reports it: the command's exit code, the trainer's termination message.
    terminated = {
        "exitCode": preempted.returncode,
        "reason": "Error",
        "message": (preempted.work / "termination-log").read_text(),
        "finishedAt": "2026-01-02T03:02:00Z",
    }
    pod = {
        "metadata": {
            "name": "preempted-0-x",
            "labels": {"batch.kubernetes.io/job-completion-index": "0", "colocgrpo.io/job-name": "preempted"},
            "ownerReferences": [{"kind": "Job", "name": "preempted", "uid": "job-1"}],
        },
        "spec": {"nodeName": "gpu-0"},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
    }
    batch_job = {
        "metadata": {"name": "preempted", "namespace": "ns", "uid": "job-1"},
        "spec": {"completions": 1, "parallelism": 1},
        "status": {
            "startTime": "2026-01-02T03:00:00Z",
            "conditions": [{"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy"}],
        },
    }
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    result = assess(RunFacts(nodes=1, gpus_per_node=WORLD, max_restarts=0), batch_job, [pod], Record(), None, now)
    assert result.action is Action.RESTART_GANG
    assert condition_of(result.status, "Running")["reason"] == "Preempted"
    assert result.status["lastFailure"]["reason"] == "Preempted"
    assert result.status["lastFailure"]["exitCode"] == 143 and result.status["lastFailure"]["counted"] is False
    assert (result.status["restarts"], result.status["disruptions"]) == (0, 1)
