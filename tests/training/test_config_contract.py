"""The trainer-config contract: what the operator renders, the trainer reads and maps to TRL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from colocgrpo_training.config import SleepPolicy, TrainerConfig
from colocgrpo_training.entrypoint import load_config
from colocgrpo_training.grpo_args import build_grpo_config, grpo_kwargs

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def job(gpus_per_node: int, **spec_overrides) -> dict:
    spec = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "bfloat16" if gpus_per_node else "float32"},
        "dataset": {"name": "AI-MO/NuminaMath-TIR", "systemPrompt": "Think first.", "maxPromptTokens": 256},
        "resources": {"nodes": 1, "gpusPerNode": gpus_per_node},
        "rewards": [{"function": "accuracy", "weight": 1.0}, {"function": "format", "weight": 0.5}],
        "checkpoint": {"path": "/checkpoints/demo", "saveSteps": 5},
        "trainerArgs": {"learning_rate": 1e-6, "num_generations": 2, "per_device_train_batch_size": 4, "max_steps": 3},
    }
    if gpus_per_node:
        spec["vllm"] = {
            "tensorParallelSize": 2,
            "gpuMemoryUtilization": 0.4,
            "sleepPolicy": "level2",
            "maxModelLen": 1024,
        }
    spec.update(spec_overrides)
    return {
        "apiVersion": "colocgrpo.io/v1alpha1",
        "kind": "ColocGRPOJob",
        "metadata": {"name": "demo", "namespace": "team-a"},
        "spec": spec,
    }


def rendered(obj: dict, tmp_path) -> TrainerConfig:
    """Render with the operator, write the ConfigMap text, read it back as the pod does."""
    from colocgrpo_operator.api import parse_job
    from colocgrpo_operator.render import render_trainer_config

    path = tmp_path / "grpo.yaml"
    path.write_text(render_trainer_config(parse_job(obj)).to_yaml())
    return load_config(str(path))


def test_gpu_job_renders_to_a_colocated_vllm_grpo_config(tmp_path):
    config = rendered(job(4), tmp_path)
    assert config.job.name == "demo" and config.job.namespace == "team-a"
    assert config.vllm.enabled and config.vllm.sleep_policy == SleepPolicy.LEVEL2
    kwargs = grpo_kwargs(config, [1.0, 0.5])
    assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "colocate"
    assert kwargs["vllm_tensor_parallel_size"] == 2
    assert kwargs["vllm_gpu_memory_utilization"] == 0.4
    assert kwargs["vllm_max_model_length"] == 1024
    assert kwargs["vllm_enable_sleep_mode"] is True
    assert kwargs["output_dir"] == "/checkpoints/demo" and kwargs["save_steps"] == 5
    assert kwargs["bf16"] is True
    assert kwargs["learning_rate"] == 1e-6


def test_offload_job_renders_to_an_offloading_config_and_the_trainer_refuses_it_without_sleep(tmp_path):
    from pydantic import ValidationError

    from colocgrpo_training.config import VLLMSettings

    obj = job(4)
    obj["spec"]["vllm"]["offloadTrainerState"] = True
    config = rendered(obj, tmp_path)
    assert config.vllm.offload_trainer_state is True
    # A hand-written grpo.yaml gets the rule the operator enforces on the spec.
    with pytest.raises(ValidationError, match="vllm.offload_trainer_state: needs a sleeping vllm.sleep_policy"):
        config.model_validate(
            {**config.model_dump(), "vllm": VLLMSettings(sleep_policy="off", offload_trainer_state=True).model_dump()}
        )


def test_cpu_job_renders_to_a_trl_config_without_vllm(tmp_path):
    config = rendered(job(0), tmp_path)
    assert config.vllm.enabled is False
    assert config.dataset.system_prompt == "Think first." and config.dataset.max_prompt_tokens == 256
    args, _ = build_grpo_config(config, [1.0, 0.5])
    assert args.use_vllm is False
    assert args.max_steps == 3 and args.num_generations == 2
    assert args.reward_weights == [1.0, 0.5]
    assert args.save_strategy == "steps" and args.save_steps == 5


def example_jobs() -> list[tuple[str, dict]]:
    return [
        (path.name, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "ColocGRPOJob"
    ]


def test_every_example_job_renders_to_a_config_the_trainer_accepts(tmp_path):
    jobs = example_jobs()
    assert jobs, "examples/*.yaml should hold ColocGRPOJobs"
    for name, obj in jobs:
        config = rendered(obj, tmp_path)
        kwargs = grpo_kwargs(config, [r.weight for r in config.rewards])  # raises on an owned/unknown key
        assert kwargs["use_vllm"] is (obj["spec"].get("resources", {}).get("gpusPerNode", 1) > 0), name


@pytest.mark.slow
def test_tiny_cpu_example_trains_through_the_rendered_config(tmp_path, tiny_model_dir, trainer_env):
    """The demo's job: render examples/tiny-cpu.yaml, point it at a tiny model, train on CPU."""
    obj = dict(example_jobs())["tiny-cpu.yaml"]
    config = rendered(obj, tmp_path)
    # Host paths instead of the image's examples and the pod's volumes, as the demo maps them.
    from colocgrpo_dev.demo import host_path

    config.model.name_or_path = str(tiny_model_dir)
    config.dataset.name_or_path = host_path(config.dataset.name_or_path, REPO, tmp_path)
    config.checkpoint.dir = str(tmp_path / "checkpoints")
    config.progress.patch_status = False
    path = tmp_path / "grpo.yaml"
    path.write_text(config.to_yaml())
    env = trainer_env(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "colocgrpo_training", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [
        json.loads(line)["progress"]["step"] for line in result.stdout.splitlines() if line.startswith('{"progress"')
    ]
    assert steps and steps[-1] == obj["spec"]["trainerArgs"]["max_steps"]
    assert (tmp_path / "checkpoints" / "final" / "config.json").is_file()
