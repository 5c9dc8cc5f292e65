"""Seed parity: every setting of the seed's open-r1 recipe survives recipe -> job -> grpo.yaml -> GRPOConfig.

The recipe (tests/data/seed-config.yaml) is an open-r1 GRPO recipe: Qwen2.5-14B-Instruct on 8 GPUs,
vLLM at tensor-parallel size 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.recipe import load_recipe, translate_recipe
from colocgrpo_operator.render import render_children
from colocgrpo_training.config import SleepPolicy, TrainerConfig
from colocgrpo_training.grpo_args import grpo_kwargs

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "tests/data/seed-config.yaml"


@pytest.fixture(scope="module")
def rendered() -> dict:
    recipe, duplicates = load_recipe(SEED.read_text())
    job_obj, report = translate_recipe(
        recipe, name="seed-qwen14b-tp4", nodes=1, gpus_per_node=8, tp=4, duplicates=duplicates
    )
    assert report.untranslatable == []
    job = parse_job(job_obj)
    children = {c["kind"]: c for c in render_children(job)}
    config = TrainerConfig.from_yaml(children["ConfigMap"]["data"]["grpo.yaml"])
    return {
        "recipe": recipe,
        "job": job,
        "children": children,
        "config": config,
        # What the trainer hands to TRL's GRPOConfig (pure mapping, no TRL import).
        "trl": grpo_kwargs(config, [r.weight for r in config.rewards]),
        "notes": report.notes,
    }


# The list, with the seed's meaning, checked where TRL finally receives it.
@pytest.mark.parametrize(
    "trl_key, expected",
    [
        ("learning_rate", 2e-5),
        ("lr_scheduler_type", "cosine"),
        ("warmup_steps", 0.1),  # transformers 5: a float in [0, 1) is a ratio, like the seed's warmup_ratio
        ("max_grad_norm", 0.2),
        ("gradient_accumulation_steps", 4),
        ("gradient_checkpointing", True),
        ("gradient_checkpointing_kwargs", {"use_reentrant": False}),
        ("num_generations", 16),
        ("per_device_train_batch_size", 16),
        ("max_completion_length", 1024),
        ("temperature", 0.7),
        ("seed", 42),
        ("max_steps", 10),
        ("vllm_tensor_parallel_size", 4),
        ("vllm_gpu_memory_utilization", 0.35),
        ("vllm_max_model_length", 1536),
        ("use_vllm", True),
        ("vllm_mode", "colocate"),
        ("bf16", True),
        ("reward_weights", [1.0, 1.0]),
        ("save_strategy", "no"),
        ("report_to", "none"),
        ("logging_steps", 5),
        ("logging_first_step", True),
        ("log_completions", False),
        ("num_train_epochs", 1),
    ],
)
def test_seed_value_reaches_trl(rendered, trl_key, expected):
    assert rendered["trl"][trl_key] == expected


def test_settings_owned_by_typed_fields(rendered):
    config = rendered["config"]
    assert config.dataset.max_prompt_tokens == 512  # TRL 1.16 dropped max_prompt_length; we truncate
    assert config.vllm.max_model_len == 1536
    assert config.vllm.enable_prefix_caching is False
    assert config.vllm.tensor_parallel_size == 4
    assert config.vllm.sleep_policy == SleepPolicy.AUTO  # never the seed's discard-weights bug
    assert config.model.name_or_path == "Qwen/Qwen2.5-14B-Instruct"
    assert config.model.revision == "main"
    assert config.model.dtype == "bfloat16"
    # The recipe's flash_attention_2 becomes sdpa (the trainer image has no flash-attn), with a note saying so.
    assert config.model.attn_implementation == "sdpa"
    assert any(
        n.startswith("attn_implementation: flash_attention_2 -> spec.model.attnImplementation sdpa")
        for n in rendered["notes"]
    )
    assert config.dataset.name_or_path == "open-r1/OpenR1-Math-220k"
    assert config.dataset.prompt_column == "problem"
    assert config.dataset.system_prompt == rendered["recipe"]["system_prompt"]
    assert [(r.function, r.weight) for r in config.rewards] == [("accuracy", 1.0), ("format", 1.0)]
    assert rendered["trl"]["model_init_kwargs"] == {
        "dtype": "bfloat16",
        "revision": "main",
        "attn_implementation": "sdpa",
    }


def test_topology_one_node_eight_gpus_tp4(rendered):
    children = rendered["children"]
    pod = children["Job"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert children["Job"]["spec"]["completions"] == 1
    accelerate = yaml.safe_load(children["ConfigMap"]["data"]["accelerate.yaml"])
    assert accelerate["num_processes"] == 8 and accelerate["distributed_type"] == "DEEPSPEED"
    assert json.loads(children["ConfigMap"]["data"]["deepspeed.json"])["zero_optimization"]["stage"] == 3
    # TRL's own invariant: the generation batch holds whole prompt groups.
    trl = rendered["trl"]
    generation_batch = trl["per_device_train_batch_size"] * 8 * trl["gradient_accumulation_steps"]
    assert generation_batch % trl["num_generations"] == 0


# Keys the recipe carries that are deliberately not passed on, with the reason in a note.
DROPPED_WITH_NOTE = {
    "use_vllm",
    "vllm_tp",
    "do_eval",
    "eval_strategy",
    "overwrite_output_dir",
    "save_strategy",
    "bf16",
    "warmup_ratio",
    "attn_implementation",  # flash_attention_2 -> sdpa: the trainer image ships no flash-attn
}


def test_every_seed_key_is_accounted_for(rendered):
    """No seed key may vanish: it is in TRL's kwargs, in a typed field, or in a note."""
    recipe, config, trl, notes = rendered["recipe"], rendered["config"], rendered["trl"], rendered["notes"]
    typed_homes = {
        "model_name_or_path": config.model.name_or_path,
        "model_revision": config.model.revision,
        "torch_dtype": config.model.dtype,
        "dataset_name": config.dataset.name_or_path,
        "system_prompt": config.dataset.system_prompt,
        "dataset_prompt_column": config.dataset.prompt_column,
        "vllm_gpu_memory_utilization": config.vllm.gpu_memory_utilization,
        "vllm_enable_prefix_caching": config.vllm.enable_prefix_caching,
        "vllm_max_model_len": config.vllm.max_model_len,
        "max_prompt_length": config.dataset.max_prompt_tokens,
        "reward_funcs": [r.function for r in config.rewards],
        "reward_weights": [r.weight for r in config.rewards],
    }
    for key, value in recipe.items():
        if key in typed_homes:
            assert typed_homes[key] == value, key
        elif key in DROPPED_WITH_NOTE:
            assert any(note.startswith(f"{key}:") for note in notes), f"{key} dropped without a note"
        else:
            assert trl.get(key) == value, f"{key} lost on the way to GRPOConfig"
