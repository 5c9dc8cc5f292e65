"""TrainerConfig → TRL GRPOConfig: typed fields own their keys, passthrough is checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from colocgrpo_training.config import TrainerConfig
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.grpo_args import OWNED_KEYS, build_grpo_config, grpo_kwargs

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]


def make_config(**overrides) -> TrainerConfig:
    data = {
        "job": {"name": "j", "namespace": "n"},
        "model": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "main", "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": "AI-MO/NuminaMath-TIR"},
        "rewards": [{"function": "accuracy", "weight": 1.0}, {"function": "format", "weight": 0.2}],
        "resources": {"gpus_per_node": 2},
        "vllm": {
            "enabled": True,
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.35,
            "sleep_policy": "level1",
            "max_model_len": 2048,
        },
        "checkpoint": {"dir": "/checkpoints/j", "save_steps": 50, "save_total_limit": 3},
        "grpo": {"learning_rate": 1e-6, "num_generations": 4, "per_device_train_batch_size": 4, "max_steps": 10},
    }
    data.update(overrides)
    return TrainerConfig.model_validate(data)


def test_typed_fields_map_to_trl_names():
    kwargs = grpo_kwargs(make_config(), reward_weights=[1.0, 0.2])
    assert kwargs["output_dir"] == "/checkpoints/j"
    assert (kwargs["save_strategy"], kwargs["save_steps"], kwargs["save_total_limit"]) == ("steps", 50, 3)
    assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "colocate"
    assert kwargs["vllm_tensor_parallel_size"] == 2
    assert kwargs["vllm_gpu_memory_utilization"] == 0.35
    assert kwargs["vllm_enable_sleep_mode"] is True
    assert kwargs["vllm_max_model_length"] == 2048
    assert kwargs["bf16"] is True and kwargs["fp16"] is False
    assert kwargs["model_init_kwargs"] == {"dtype": "bfloat16", "revision": "main", "attn_implementation": "sdpa"}
    assert kwargs["reward_weights"] == [1.0, 0.2]
    assert kwargs["learning_rate"] == 1e-6 and kwargs["max_steps"] == 10
    assert kwargs["logging_steps"] == 1 and kwargs["report_to"] == "none"


def test_sleep_off_disables_sleep_mode_and_cpu_jobs_skip_vllm_keys():
    off = make_config(vllm={"enabled": True, "sleep_policy": "off"})
    assert grpo_kwargs(off)["vllm_enable_sleep_mode"] is False
    cpu = grpo_kwargs(make_config(vllm={"enabled": False}, model={"name_or_path": "m", "dtype": "float32"}))
    assert cpu["use_vllm"] is False
    assert not any(key.startswith("vllm_") for key in cpu)
    assert cpu["bf16"] is False and cpu["fp16"] is False


def test_passthrough_can_override_our_defaults():
    kwargs = grpo_kwargs(make_config(grpo={"logging_steps": 10, "report_to": ["wandb"]}))
    assert kwargs["logging_steps"] == 10 and kwargs["report_to"] == ["wandb"]


def test_passthrough_may_not_set_owned_keys():
    with pytest.raises(InvalidConfigError) as err:
        grpo_kwargs(make_config(grpo={"vllm_tensor_parallel_size": 4, "output_dir": "/x"}))
    assert "grpo.output_dir is set by checkpoint.dir" in str(err.value)
    assert "grpo.vllm_tensor_parallel_size is set by vllm.tensorParallelSize" in str(err.value)


def test_no_save_steps_means_no_periodic_saves():
    assert grpo_kwargs(make_config(checkpoint={"dir": "/c"}))["save_strategy"] == "no"


def test_owned_keys_are_real_grpo_config_fields():
    from trl import GRPOConfig

    assert set(OWNED_KEYS) <= {f.name for f in dataclasses.fields(GRPOConfig)}


def test_build_grpo_config_on_cpu(tmp_path):
    config = make_config(
        vllm={"enabled": False},
        model={"name_or_path": "m", "dtype": "float32"},
        checkpoint={"dir": str(tmp_path), "save_steps": 1},
        grpo={"num_generations": 2, "per_device_train_batch_size": 4, "max_steps": 2, "use_cpu": True},
    )
    args, _ = build_grpo_config(config, [1.0, 0.2])
    assert args.output_dir == str(tmp_path)
    assert args.num_generations == 2 and args.max_steps == 2 and args.use_vllm is False
    assert args.reward_weights == [1.0, 0.2]


def test_unknown_and_rejected_grpo_fields_are_invalid_config(tmp_path):
    base = {"vllm": {"enabled": False}, "checkpoint": {"dir": str(tmp_path)}}
    with pytest.raises(InvalidConfigError, match=r"unknown TRL 1.16 GRPOConfig field\(s\) \['max_prompt_length'\]"):
        build_grpo_config(make_config(grpo={"max_prompt_length": 512, "use_cpu": True}, **base))
    with pytest.raises(InvalidConfigError, match="TRL rejected.*num_generations"):
        build_grpo_config(
            make_config(grpo={"num_generations": 3, "per_device_train_batch_size": 4, "use_cpu": True}, **base)
        )


def test_committed_grpo_field_list_matches_trl():
    """The operator validates passthrough keys offline against this list; it must be TRL's."""
    from trl import GRPOConfig

    committed = REPO / "operator" / "colocgrpo_operator" / "api" / "grpo_config_fields.txt"
    listed = {line.strip() for line in committed.read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert listed == {f.name for f in dataclasses.fields(GRPOConfig)}
