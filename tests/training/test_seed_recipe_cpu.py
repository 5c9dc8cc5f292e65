"""The seed recipe's own options, run: examples/seed-qwen14b-tp4.yaml (an open-r1 GRPO recipe converted by
`colocgrpo from-recipe`) at world 4 with vLLM TP 2, its pod command rendered by the operator and launched here on CPU.

What changes from the example is only what a CPU host and a tiny model need: the model (a tiny random Qwen2, the
recipe's architecture, float32), the dataset (a local file with the recipe's prompt column, `problem`, and the
`solution` its accuracy reward reads), 4 GPUs instead of 8 with TP 2 instead of 4, completions of 16 tokens instead of
1,024 with 4 generations and 2 rows per micro-batch, and gloo. Everything else is the recipe's: the system prompt,
the accuracy and format rewards with their weights, the cosine schedule with a warmup ratio, gradient checkpointing
with use_reentrant false, max_grad_norm, the temperature, gradient accumulation 4, sdpa attention, prompts of up to
512 tokens, the vLLM settings the recipe gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from support import rank_probe
from support.local_pod import launch_pod, render_pod

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
WORLD, TP, STEPS = 4, 2, 3
LAUNCH_LIMIT_S = 300  # about a minute on two loaded cores; past this it hangs


def seed_job_on_cpu(work: Path, model: Path) -> dict:
    job = yaml.safe_load((REPO / "examples/seed-qwen14b-tp4.yaml").read_text())
    spec = job["spec"]
    rows = [{"problem": f"What is {i} + {i + 1}?", "solution": f"${2 * i + 1}$"} for i in range(16)]
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec["model"].update(name=str(model), dtype="float32")
    spec["model"].pop("revision")
    spec["dataset"]["name"] = str(work / "train.jsonl")
    spec["resources"].update(gpusPerNode=WORLD)
    spec["vllm"]["tensorParallelSize"] = TP
    spec["checkpoint"] = {"path": str(work / "checkpoints"), "saveFinalModel": False}
    spec["trainerArgs"].update(
        max_steps=STEPS,
        per_device_train_batch_size=2,
        num_generations=4,
        max_completion_length=16,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return job


def test_the_seed_recipes_options_train_three_steps_at_world_4_tp_2(tmp_path, tiny_model_dir, pod_env):
    job = seed_job_on_cpu(tmp_path, tiny_model_dir)
    kept = yaml.safe_load((REPO / "examples/seed-qwen14b-tp4.yaml").read_text())["spec"]
    assert job["spec"]["dataset"]["systemPrompt"] == kept["dataset"]["systemPrompt"]
    assert job["spec"]["rewards"] == [{"function": "accuracy", "weight": 1.0}, {"function": "format", "weight": 1.0}]
    for key in ("lr_scheduler_type", "warmup_steps", "gradient_checkpointing_kwargs", "max_grad_norm", "temperature"):
        assert job["spec"]["trainerArgs"][key] == kept["trainerArgs"][key], key
    command = render_pod(job, tmp_path / "config")
    env = {**pod_env(tmp_path), rank_probe.DIR_ENV: str(tmp_path / "probe"), "PYTHONUNBUFFERED": "1"}
    run = launch_pod(command, tmp_path, env, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=tmp_path / "probe")
    assert run.returncode == 0, run.tail()
    assert max(run.progress_steps()) == STEPS, run.tail()
    logged = [r["logs"] for r in run.events(0, "log") if "loss" in r["logs"]]
    # logging_first_step with logging_steps 5: step 1 is logged, with both rewards and the scheduler's warmup.
    expected = {"rewards/accuracy_reward/mean", "rewards/format_reward/mean", "learning_rate"}
    assert logged and expected <= logged[0].keys()
    assert logged[0]["learning_rate"] < kept["trainerArgs"]["learning_rate"]  # warming up, not at the peak
    # Every rank built its engine at the job's TP size and generated with the recipe's system prompt.
    for rank in range(WORLD):
        (build,) = run.events(rank, "build")
        assert build["tp"] == TP
        assert run.events(rank, "generate"), f"rank {rank} never generated"
