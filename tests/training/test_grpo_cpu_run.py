"""A real TRL GRPO run on CPU through the pod's entrypoint, on a tiny model built here.

Two optimizer steps with a checkpoint each, the JSON progress lines, the final model;
then a second run resumes from the newest *complete* checkpoint (a half-written newer one
is skipped); and SIGTERM saves a checkpoint and exits 143 with a termination message.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from colocgrpo_training.checkpoints import COMPLETE_MARKER
from colocgrpo_training.config import CONFIG_VERSION

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

ROWS = [
    {"problem": "What is 2 + 3?", "solution": "$5$"},
    {"problem": "What is 7 + 5?", "solution": "$12$"},
    # math_verify cannot parse this gold answer: the accuracy reward returns None for it.
    {"problem": "Explain addition.", "solution": "it depends"},
    {"problem": "What is 4 + 4?", "solution": "$8$"},
]


def write_config(workdir: Path, model_dir: Path, *, max_steps: int, save_steps: int | None) -> Path:
    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = {
        "version": CONFIG_VERSION,
        "job": {"name": "tiny", "namespace": "default"},
        "model": {"name_or_path": str(model_dir), "dtype": "float32"},
        "dataset": {"name_or_path": str(data), "system_prompt": "Answer in <answer> tags.", "max_prompt_tokens": 64},
        "rewards": [
            {"function": "accuracy", "weight": 1.0},
            {"function": "format", "weight": 0.5},
            {"function": "tag_count", "weight": 0.5},
        ],
        "vllm": {"enabled": False},
        "checkpoint": {"dir": str(workdir / "checkpoints"), "save_steps": save_steps, "save_total_limit": 3},
        # Patching is off: no cluster here (test_progress_cluster.py covers the API side).
        "progress": {"min_interval_seconds": 0, "patch_status": False},
        "grpo": {
            "max_steps": max_steps,
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "max_completion_length": 8,
            "learning_rate": 1e-3,
            "beta": 0.04,
            "seed": 7,
            "dataloader_num_workers": 0,
            "disable_tqdm": True,
        },
    }
    path = workdir / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def progress_lines(stdout: str) -> list[dict]:
    return [json.loads(line)["progress"] for line in stdout.splitlines() if line.startswith('{"progress"')]


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def test_two_steps_checkpoint_then_resume(tmp_path, tiny_model_dir, trainer_env):
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, save_steps=1)
    first = subprocess.run(
        [sys.executable, "-m", "colocgrpo_training", "--config", str(config)],
        capture_output=True,
        text=True,
        env=trainer_env(tmp_path),
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-3000:]

    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert global_step(checkpoints / "checkpoint-2") == 2

    reports = progress_lines(first.stdout)
    assert sorted({r["step"] for r in reports}) == [0, 1, 2]  # 0: reported when training begins
    assert all(r["maxSteps"] == 2 for r in reports)
    last = reports[-1]
    assert {"reward", "kl", "loss", "completion_length", "step_time_seconds"} <= set(last["metrics"])
    assert 0 < last["metrics"]["completion_length"] <= 8
    assert last["lastCheckpoint"].endswith("checkpoint-2")
    assert last["lastUpdateTime"].endswith("Z")

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(checkpoints / "final"))
    assert final.config.hidden_size == 64

    # A pod killed while saving leaves a newer checkpoint without our marker: never resume from it.
    half_written = checkpoints / "checkpoint-9"
    half_written.mkdir()
    (half_written / "trainer_state.json").write_text(json.dumps({"global_step": 9}))

    config = write_config(tmp_path, tiny_model_dir, max_steps=3, save_steps=1)
    second = subprocess.run(  # through the console script the pods run this time
        [str(Path(sys.executable).parent / "colocgrpo-train"), "--config", str(config)],
        capture_output=True,
        text=True,
        env=trainer_env(tmp_path),
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {checkpoints / 'checkpoint-2'}" in second.stderr
    assert "skipping incomplete checkpoint" in second.stderr
    assert sorted({r["step"] for r in progress_lines(second.stdout)}) == [2, 3]  # begins at the resumed step
    assert global_step(checkpoints / "checkpoint-3") == 3
    assert (checkpoints / "checkpoint-3" / COMPLETE_MARKER).is_file()


def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path, tiny_model_dir, trainer_env):
    config = write_config(tmp_path, tiny_model_dir, max_steps=500, save_steps=None)
    process = subprocess.Popen(
        [sys.executable, "-m", "colocgrpo_training", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=trainer_env(tmp_path),
    )
    try:
        for line in process.stdout:  # wait until training is really stepping
            if line.startswith('{"progress"'):
                break
        process.send_signal(signal.SIGTERM)
        _rest, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143

    message = json.loads((tmp_path / "termination-log").read_text())
    assert message["reason"] == "Terminated"
    saved = [p for p in (tmp_path / "checkpoints").glob("checkpoint-*") if (p / COMPLETE_MARKER).is_file()]
    assert len(saved) == 1
    step = global_step(saved[0])
    assert 1 <= step < 500
    assert saved[0].name in message["message"]
    assert not (tmp_path / "checkpoints" / "final").exists()  # stopped early: no final model
