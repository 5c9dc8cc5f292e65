"""World size 4 with one rank that fails: every rank stops together, with that rank's cause.

A 4-GPU job with vLLM TP 2 (two TP groups of two ranks) under DeepSpeed ZeRO-3, rendered by the operator, its pod
command launched here on CPU over gloo (`support.local_pod`), each launch under a hard time limit. One rank fails
where a real job's rank would, the others being healthy:

- rewards: the job's reward function raises on rank 2 alone (its completions are the ones it cannot score);
- prompt: a prompt longer than vLLM's max model length reaches rank 2, in TP group (2, 3), and `maxPromptTokens` is
  unset, so nothing truncated it;
- dataset: the dataset file is missing on rank 3 (its working directory differs, and the path goes through
  /proc/self/cwd);
- pinned: rank 1's trainer-state offload fails as a pinned host allocation CUDA refuses does.

Each rank writes its own termination message here (the probe's per-rank environment). Checked for each: every rank
exits within 60 s of the failure with the same exit code (none killed by a signal), every rank's termination message
is the same and names the cause, and the pod command exits with that code.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from colocgrpo_training.failures import EXIT_FAILED, EXIT_INVALID_CONFIG
from support import rank_probe
from support.local_pod import SHORT_RUN, Launch, cpu_pod_job, launch_probed

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD, TP = 4, 2
SHAPE = {"gpus": WORLD, "tp": TP, "sleep_policy": "auto"}
LAUNCH_LIMIT_S = 240  # a launch that fails early takes about a minute on two loaded cores; past this it hangs
STOP_WITHIN_S = 60  # from the failure to the last rank's exit

FLAKY_REWARD = """
import json, os, pathlib, time


def flaky(completions, **kwargs):
    if os.environ.get("RANK") == "2":
        fault = pathlib.Path(os.environ["COLOCGRPO_PROBE_DIR"], "reward-fault.json")
        fault.write_text(json.dumps({"time": time.time()}))
        raise ValueError("the judge cannot score this completion")
    return [float(sum(map(ord, str(c))) % 7) for c in completions]
"""


@dataclass
class Failed:
    """A launch that failed, when it ended, and every rank's termination message."""

    run: Launch
    ended_at: float
    messages: dict[int, dict]

    def struck_at(self) -> float:
        """When the injected fault struck: the probe's record, the reward module's, or the first report."""
        probe = [r["time"] for rank in range(WORLD) for r in self.run.events(rank, "fault")]
        reward = self.run.work / "probe" / "reward-fault.json"
        if reward.exists():
            probe.append(json.loads(reward.read_text())["time"])
        logs = [(self.run.work / f"termination-log-{rank}").stat().st_mtime for rank in range(WORLD)]
        return min(probe) if probe else min(logs)


def launch_failing(root: Path, name: str, model: Path, env: dict[str, str], probe: dict[str, str], **spec) -> Failed:
    """The job with `spec`'s sections changed, launched with the probe settings `probe`; each rank's termination
    message in its own file."""
    work = root / name
    work.mkdir(parents=True)
    checkpoint = {"path": str(work / "checkpoints"), "saveFinalModel": False}
    job = cpu_pod_job(
        work, model, **SHAPE, name=name, checkpoint=checkpoint, trainer_args={**SHORT_RUN, "max_steps": 2}
    )
    for section, values in spec.items():
        job["spec"][section] = {**job["spec"][section], **values} if isinstance(values, dict) else values
    (work / "rewards" / "flaky_rewards.py").write_text(FLAKY_REWARD)
    logs = ";".join(f"{rank}:COLOCGRPO_TERMINATION_LOG={work / f'termination-log-{rank}'}" for rank in range(WORLD))
    per_rank = ";".join(filter(None, [logs, probe.get(rank_probe.RANK_ENV_ENV, "")]))
    run = launch_probed(
        job, work, env, {**probe, rank_probe.RANK_ENV_ENV: per_rank}, world=WORLD, limit_s=LAUNCH_LIMIT_S
    )
    ended_at = time.time()
    messages = {}
    for rank in range(WORLD):
        path = work / f"termination-log-{rank}"
        assert path.exists(), f"rank {rank} wrote no termination message\n{run.tail()}"
        messages[rank] = json.loads(path.read_text())
    return Failed(run, ended_at, messages)


def assert_one_verdict(failed: Failed, reason: str, code: int, message: str) -> None:
    run = failed.run
    assert run.exit_codes() == dict.fromkeys(range(WORLD), code), run.tail()  # none SIGKILLed (-9) or SIGTERMed
    assert run.returncode == code, run.tail()  # the pod command: the code its ranks agreed on
    assert all(failed.messages[rank] == failed.messages[0] for rank in range(WORLD)), failed.messages
    assert failed.messages[0]["reason"] == reason, failed.messages[0]
    assert failed.messages[0]["message"].startswith(message), failed.messages[0]
    printed = re.findall(r"^colocgrpo: (\w+): (.+)$", run.stderr, re.MULTILINE)
    assert printed == [(reason, failed.messages[0]["message"])] * WORLD, printed
    took = failed.ended_at - failed.struck_at()
    assert took <= STOP_WITHIN_S, f"the last rank exited {took:.0f} s after the failure"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("failures")


@pytest.fixture(scope="module")
def env(root, pod_env) -> dict[str, str]:
    return pod_env(root)


def test_a_reward_that_raises_on_rank_2_stops_every_rank_with_it(root, tiny_model_dir, env):
    failed = launch_failing(root, "reward", tiny_model_dir, env, {}, rewards=[{"function": "flaky_rewards:flaky"}])
    assert_one_verdict(
        failed,
        "RewardFunctionError",
        EXIT_FAILED,
        "rank 2 failed in generation and rewards at step 0: reward function flaky_rewards:flaky (rewards[0]) "
        "raised ValueError: the judge cannot score this completion",
    )


def test_an_over_long_prompt_in_tp_group_2_3_stops_every_rank_naming_it(root, tiny_model_dir, env):
    failed = launch_failing(
        root,
        "prompt",
        tiny_model_dir,
        env,
        {rank_probe.LONG_PROMPT_ENV: "2:300"},
        dataset={"maxPromptTokens": None},
    )
    assert_one_verdict(
        failed,
        "DataError",
        EXIT_FAILED,
        "every rank stopped in generation and rewards at step 0: 1 prompt(s) longer than the 127 tokens vLLM takes "
        "(its max model length 128, vllm.maxModelLen, less one token to generate): rank 2's prompt 0, 300 tokens,",
    )
    assert not any(failed.run.events(rank, "generate") for rank in range(WORLD))  # vLLM never saw it


def test_a_dataset_file_missing_on_rank_3_stops_every_rank_naming_it(root, tiny_model_dir, env):
    elsewhere = root / "rank3-cwd"
    elsewhere.mkdir()
    failed = launch_failing(
        root,
        "dataset",
        tiny_model_dir,
        env,
        {rank_probe.CWD_ENV: f"3:{elsewhere}"},
        dataset={"name": "/proc/self/cwd/train.jsonl"},
    )
    assert_one_verdict(
        failed,
        "InvalidConfig",
        EXIT_INVALID_CONFIG,
        "rank 3 failed in setup: dataset.name '/proc/self/cwd/train.jsonl' does not exist on this node",
    )


def test_a_failed_pinned_allocation_on_rank_1_stops_every_rank_with_it(root, tiny_model_dir, env):
    failed = launch_failing(root, "pinned", tiny_model_dir, env, {rank_probe.PINNED_ALLOC_FAILS_ENV: "1"})
    assert_one_verdict(
        failed,
        "CUDAOutOfMemory",
        EXIT_FAILED,
        f"rank 1 failed offloading the trainer state at step 0: RuntimeError: {rank_probe.PINNED_ALLOC_ERROR}",
    )
