"""The recipe translation table, row by row."""

from __future__ import annotations

import pytest

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.recipe import TRANSLATIONS, default_job_name, load_recipe, translate_recipe

BASE = {"model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "dataset_name": "d", "reward_funcs": ["accuracy"]}


def translate(extra: dict, **kwargs):
    job, report = translate_recipe({**BASE, **extra}, **kwargs)
    return job, report


def spec_at(job: dict, path: str):
    node = job["spec"]
    for part in path.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize(
    "key, value, path, expected",
    [
        ("model_name_or_path", "org/model", "model.name", "org/model"),
        ("model_revision", "v2", "model.revision", "v2"),
        ("torch_dtype", "float16", "model.dtype", "float16"),
        ("dtype", "float32", "model.dtype", "float32"),
        ("attn_implementation", "sdpa", "model.attnImplementation", "sdpa"),
        ("attn_implementation", "eager", "model.attnImplementation", "eager"),
        ("attn_implementation", "flash_attention_2", "model.attnImplementation", "sdpa"),
        ("attn_implementation", "flash_attention_3", "model.attnImplementation", "sdpa"),
        ("dataset_name", "org/data", "dataset.name", "org/data"),
        ("dataset_config", "default", "dataset.config", "default"),
        ("dataset_train_split", "train[:1%]", "dataset.split", "train[:1%]"),
        ("dataset_prompt_column", "question", "dataset.promptColumn", "question"),
        ("system_prompt", "Be brief.", "dataset.systemPrompt", "Be brief."),
        ("chat_template", "{{ x }}", "dataset.chatTemplate", "{{ x }}"),
        ("max_prompt_length", 256, "dataset.maxPromptTokens", 256),
        ("vllm_gpu_memory_utilization", 0.5, "vllm.gpuMemoryUtilization", 0.5),
        ("vllm_enable_prefix_caching", False, "vllm.enablePrefixCaching", False),
        ("vllm_max_model_len", 4096, "vllm.maxModelLen", 4096),
        ("vllm_max_model_length", 2048, "vllm.maxModelLen", 2048),
        ("vllm_max_num_seqs", 64, "vllm.maxNumSeqs", 64),
        ("vllm_tensor_parallel_size", 2, "vllm.tensorParallelSize", 2),
        ("vllm_enable_sleep_mode", True, "vllm.sleepPolicy", "auto"),
        ("vllm_enable_sleep_mode", False, "vllm.sleepPolicy", "off"),
        ("warmup_ratio", 0.05, "trainerArgs.warmup_steps", 0.05),
        ("save_steps", 100, "checkpoint.saveSteps", 100),
        ("save_total_limit", 3, "checkpoint.saveTotalLimit", 3),
        ("learning_rate", 3e-6, "trainerArgs.learning_rate", 3e-6),
        ("beta", 0.04, "trainerArgs.beta", 0.04),
    ],
)
def test_translated_keys_land_in_their_field(key, value, path, expected):
    job, report = translate({key: value})
    assert spec_at(job, path) == expected
    assert report.untranslatable == []
    parse_job(job)


@pytest.mark.parametrize(
    "key, value",
    [
        ("use_vllm", True),
        ("vllm_mode", "colocate"),
        ("overwrite_output_dir", True),
        ("output_dir", "data/out"),
        ("do_eval", False),
        ("eval_strategy", "no"),
        ("save_strategy", "no"),
        ("bf16", True),
    ],
)
def test_dropped_keys_leave_a_note(key, value):
    job, report = translate({key: value})
    assert any(note.startswith(f"{key}:") for note in report.notes)
    assert report.untranslatable == []
    assert key not in job["spec"].get("trainerArgs", {})


@pytest.mark.parametrize(
    "key, value",
    [
        ("use_vllm", False),
        ("vllm_mode", "server"),
        ("do_eval", True),
        ("eval_strategy", "steps"),
        ("save_strategy", "epoch"),
        ("use_peft", True),
        ("lora_r", 16),
        ("hub_token", "hf_xxx"),
        ("deepspeed", "zero3.json"),
        ("torch_dtype", "int8"),
        ("warmup_ratio", 1.5),
        ("wandb_project", "x"),
        ("learning_rat", 1e-5),
    ],
)
def test_untranslatable_keys_are_reported(key, value):
    _, report = translate({key: value})
    assert any(item.startswith(f"{key}:") for item in report.untranslatable)


def test_did_you_mean_for_typos():
    _, report = translate({"learning_rat": 1e-5})
    assert "did you mean 'learning_rate'" in report.untranslatable[0]


def test_warmup_ratio_and_steps_conflict():
    _, report = translate({"warmup_ratio": 0.1, "warmup_steps": 10})
    assert any(item.startswith("warmup_ratio:") for item in report.untranslatable)


def test_rewards_and_weights_pair_up():
    job, report = translate({"reward_funcs": ["accuracy", "format"], "reward_weights": [2.0, 0.5]})
    assert job["spec"]["rewards"] == [{"function": "accuracy", "weight": 2.0}, {"function": "format", "weight": 0.5}]
    _, report = translate({"reward_funcs": ["accuracy", "format"], "reward_weights": [1.0]})
    assert any(item.startswith("reward_weights:") for item in report.untranslatable)


def test_bf16_contradicting_dtype_is_reported():
    _, report = translate({"torch_dtype": "float32", "bf16": True})
    assert any(item.startswith("bf16:") for item in report.untranslatable)


def test_model_init_kwargs_split_between_typed_fields_and_passthrough():
    job, _ = translate({"model_init_kwargs": {"torch_dtype": "float16", "use_kernels": True}})
    assert job["spec"]["model"]["dtype"] == "float16"
    assert job["spec"]["trainerArgs"]["model_init_kwargs"] == {"use_kernels": True}


def test_command_line_topology_wins_with_a_note():
    job, report = translate({"vllm_tensor_parallel_size": 2}, gpus_per_node=8, tp=4)
    assert job["spec"]["vllm"]["tensorParallelSize"] == 4
    assert any("replaced by --tp 4" in note for note in report.notes)
    job, report = translate({"vllm_tp": True}, gpus_per_node=8, tp=None)
    assert any(item.startswith("vllm_tp:") for item in report.untranslatable)


def test_cpu_job_from_recipe():
    job, _report = translate({}, gpus_per_node=0)
    assert job["spec"]["resources"]["gpusPerNode"] == 0
    parse_job(job)


def test_duplicated_keys_are_detected():
    recipe, duplicates = load_recipe("a: 1\nb: 2\na: 1\nb: 3\nnested: {x: 1}\n")
    assert recipe == {"a": 1, "b": 3, "nested": {"x": 1}}
    assert duplicates == [("a", 1, 1), ("b", 2, 3)]
    _, report = translate_recipe({**BASE, **recipe}, duplicates=duplicates)
    assert any(n.startswith("a: appears more than once") for n in report.notes)
    assert any(i.startswith("b: appears more than once with different values") for i in report.untranslatable)


@pytest.mark.parametrize("text", ["- a\n", "just text\n", ""])
def test_recipe_must_be_a_mapping(text):
    with pytest.raises(ValueError):
        load_recipe(text)


def test_default_job_name_is_a_valid_name():
    assert default_job_name("Qwen/Qwen2.5-14B-Instruct") == "qwen2-5-14b-instruct-grpo"
    assert default_job_name("/models/7B") == "job-7b-grpo"
    assert len(default_job_name("x" * 200)) <= 52


def test_table_targets_are_documented():
    for key, (target, handler) in TRANSLATIONS.items():
        assert target and callable(handler), key
