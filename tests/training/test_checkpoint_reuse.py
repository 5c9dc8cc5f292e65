"""A save into a step folder that holds an older checkpoint, killed midway: the next start does not resume from it.

A 2-GPU job (vLLM TP 1, DeepSpeed ZeRO-3 over gloo) rendered by the operator, its pod command launched here on CPU
(`support.local_pod`), three times on one checkpoint folder:
1. two steps, a checkpoint at each: checkpoint-1 and checkpoint-2, complete;
2. rank 1's listing lacks checkpoint-2 (a lagging listing), so the ranks resume from checkpoint-1, train step 2 again
   and save into checkpoint-2, where rank 1 is SIGKILLed after the model files, before its optimizer states and
   trainer_state.json: the folder holds new model files beside the old states and the old trainer_state.json;
3. a plain start: it resumes from checkpoint-1, not from the torn checkpoint-2, and saves checkpoint-2 again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from colocgrpo_training.checkpoints import COMPLETE_MARKER
from support import rank_probe
from support.local_pod import SHORT_RUN, Launch, cpu_pod_job, launch_pod, render_pod

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD = 2
LAUNCH_LIMIT_S = 240  # a launch takes under a minute on two loaded cores; past this it hangs


def launch(root: Path, name: str, model: Path, env: dict[str, str], probe: dict[str, str]) -> Launch:
    work = root / name
    work.mkdir()
    job = cpu_pod_job(
        work,
        model,
        name="reuse",
        gpus=WORLD,
        tp=1,
        sleep_policy="auto",
        checkpoint={"path": str(root / "checkpoints"), "saveSteps": 1, "saveTotalLimit": 3, "saveFinalModel": False},
        trainer_args={**SHORT_RUN, "max_steps": 2},
    )
    command = render_pod(job, work / "config", reward_modules_dir=work / "rewards")
    env = {**env, rank_probe.DIR_ENV: str(work / "probe"), "COLOCGRPO_TERMINATION_LOG": str(work / "termination-log")}
    return launch_pod(command, work, env | probe, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=work / "probe")


def resumed_from(run: Launch) -> list[tuple[str, str]]:
    return sorted(re.findall(r"rank(\d) WARNING colocgrpo_training.grpo_run: resuming from (\S+)", run.stderr))


def test_a_killed_save_into_a_reused_folder_is_never_resumed_from(tmp_path, tiny_model_dir, pod_env):
    env = pod_env(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    first = launch(tmp_path, "first", tiny_model_dir, env, {})
    assert first.returncode == 0, first.tail()
    old_state = (checkpoints / "checkpoint-2" / "trainer_state.json").read_text()
    assert (checkpoints / "checkpoint-2" / COMPLETE_MARKER).is_file()

    torn = launch(
        tmp_path,
        "torn",
        tiny_model_dir,
        env,
        {rank_probe.HIDE_ENV: "1:checkpoint-2", rank_probe.KILL_IN_SAVE_ENV: "1:checkpoint-2"},
    )
    assert resumed_from(torn) == [(str(r), str(checkpoints / "checkpoint-1")) for r in range(WORLD)], torn.tail()
    assert [r["what"] for r in torn.events(1, "fault")] == ["SIGKILL while saving checkpoint-2"], torn.tail()
    assert torn.returncode != 0
    # Torn: the step's old trainer_state.json is still there, and only the marker says the save did not finish.
    assert (checkpoints / "checkpoint-2" / "trainer_state.json").read_text() == old_state
    assert not (checkpoints / "checkpoint-2" / COMPLETE_MARKER).exists()

    after = launch(tmp_path, "after", tiny_model_dir, env, {})
    assert after.returncode == 0, after.tail()
    assert resumed_from(after) == [(str(r), str(checkpoints / "checkpoint-1")) for r in range(WORLD)], after.tail()
    assert "skipping incomplete checkpoint" in after.stderr
    assert (checkpoints / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert json.loads((checkpoints / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
