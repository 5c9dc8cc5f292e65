"""Whole plans: verdicts, the terms they name, the recommendation, and the inputs they read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colocgrpo_training.planner import (
    DEFAULT_GPU_MEMORY_GIB,
    GPU_MEMORY_ANNOTATION,
    PlanInputError,
    plan_from_spec,
    plan_job,
)
from colocgrpo_training.planner import formulas as f

GIB = 1024**3


def seed_spec(**vllm) -> dict:
    """The seed recipe (tests/data/seed-config.yaml) as a spec: Qwen2.5-14B, 1 node x 8 H200, TP 4, util 0.35."""
    return {
        "model": {"name": "Qwen/Qwen2.5-14B-Instruct", "dtype": "bfloat16"},
        "dataset": {"name": "open-r1/OpenR1-Math-220k", "maxPromptTokens": 512},
        "resources": {"nodes": 1, "gpusPerNode": 8},
        "vllm": {"tensorParallelSize": 4, "gpuMemoryUtilization": 0.35, "maxModelLen": 1536, **vllm},
        "deepspeed": {"zeroStage": 3},
        "rewards": [{"function": "accuracy"}, {"function": "format"}],
        "trainerArgs": {
            "per_device_train_batch_size": 16,
            "gradient_accumulation_steps": 4,
            "max_completion_length": 1024,
            "gradient_checkpointing": True,
            "num_generations": 16,
        },
    }


def term(plan, phase: str, prefix: str) -> int:
    (match,) = [t for t in plan.terms if t.phase == phase and t.name.startswith(prefix)]
    return match.bytes


def test_seed_job_fits_with_numbers():
    plan = plan_from_spec(seed_spec())
    assert plan.fits, plan.problems
    assert plan.gpu_memory_gib == DEFAULT_GPU_MEMORY_GIB
    # vLLM's reservation is a fraction of the WHOLE GPU: 0.35 x 139.8 GiB = 48.93 GiB
    assert plan.per_gpu_vllm_gib == pytest.approx(0.35 * 139.8, abs=0.01)
    # model states: 18 x 14,770,033,664 / 8 bytes = 30.95 GiB, all kept on the GPU while vLLM generates
    p = 14_770_033_664
    assert term(plan, "training", "optimizer") == 12 * p // 8
    assert term(plan, "generation", "trainer optimizer") == 12 * p // 8
    # generation peak = reservation + states (2+4+12 bytes/param / 8) + CUDA context
    expected_generation = int(0.35 * int(139.8 * GIB)) + (2 * p // 8 + 4 * p // 8) + 12 * p // 8 + f.CUDA_CONTEXT_BYTES
    assert plan.per_gpu_generation_gib == pytest.approx(expected_generation / GIB)
    # engine batch: 16 per device x TP 4 x 4 steps per generation = 256 sequences of 1536 tokens,
    # KV 49,152 B/token -> 256 x 1536 x 49,152 = 19,327,352,832 B = 18.0 GiB
    assert term(plan, "vllm", "KV cache for the whole batch") == 256 * 1536 * 49_152
    # the recommendation sizes vLLM for that batch and stays below what the trainer leaves
    low, high = plan.utilization_range
    assert low <= plan.recommended_gpu_memory_utilization <= high
    assert plan.recommended_gpu_memory_utilization * 139.8 >= plan.vllm_needed_gib
    assert plan.recommended_gpu_memory_utilization < 0.35  # the seed over-provisions vLLM
    assert not plan.warnings


def test_72b_on_one_gpu_does_not_fit_and_names_the_term():
    spec = {
        "model": {"name": "Qwen/Qwen2.5-72B-Instruct"},
        "resources": {"gpusPerNode": 1},
        "vllm": {"maxModelLen": 2048},
    }
    plan = plan_from_spec(spec)
    assert not plan.fits
    text = " ".join(plan.problems)
    # optimizer states alone: 12 x 72.7e9 bytes = 812.6 GiB
    assert "largest term: optimizer states" in text and "812.6 GiB" in text
    assert "GiB over" in text
    # vLLM's weights alone (2 x 72.7e9 = 135.4 GiB) exceed a 0.3 x 139.8 = 41.9 GiB reservation
    assert "vLLM does not fit in its reservation" in text and "135.4 GiB" in text
    assert plan.recommended_gpu_memory_utilization is None


def test_sleep_makes_vllm_and_training_non_additive_but_not_states():
    asleep = plan_from_spec(seed_spec(sleepPolicy="level2"))
    awake = plan_from_spec(seed_spec(sleepPolicy="off"))
    budget = int(0.35 * int(139.8 * GIB))
    residual = f.vllm_sleep_residual_bytes(4)  # TP 4: CUDA graphs + NCCL, 1.5 GiB
    assert (awake.per_gpu_training_gib - asleep.per_gpu_training_gib) * GIB == pytest.approx(budget - residual)
    # the generation phase holds the trainer states either way
    assert awake.per_gpu_generation_gib == pytest.approx(asleep.per_gpu_generation_gib)
    # level1 frees the same GPU memory as level2 (weights go to pinned CPU memory)
    assert plan_from_spec(seed_spec(sleepPolicy="level1")).per_gpu_training_gib == asleep.per_gpu_training_gib


def test_offload_trainer_state_frees_optimizer_during_generation():
    kept = plan_from_spec(seed_spec())
    moved = plan_from_spec(seed_spec(offloadTrainerState=True))
    optimizer = 12 * 14_770_033_664 // 8
    assert (kept.per_gpu_generation_gib - moved.per_gpu_generation_gib) * GIB == pytest.approx(optimizer)
    assert moved.utilization_range[1] > kept.utilization_range[1]


def test_too_high_utilization_does_not_fit_in_generation():
    plan = plan_from_spec(seed_spec(gpuMemoryUtilization=0.9))
    assert not plan.fits
    (problem,) = plan.problems
    # 0.9 x 139.8 = 125.8 GiB + 30.9 GiB states + 0.75 GiB context > 139.8 GiB
    assert problem.startswith("generation phase needs") and "lower gpuMemoryUtilization to" in problem


def test_too_low_utilization_cannot_start_vllm():
    plan = plan_from_spec(seed_spec(gpuMemoryUtilization=0.05))
    assert not plan.fits
    # 0.05 x 139.8 = 7.0 GiB < weights/TP 6.9 + activations + CUDA graphs 1.5 + one 1536-token sequence
    assert any("vLLM does not fit in its reservation" in p and "use at least" in p for p in plan.problems)


def test_small_kv_budget_is_a_warning_not_a_failure():
    plan = plan_from_spec(seed_spec(gpuMemoryUtilization=0.1))
    assert plan.fits
    assert any("generate in waves" in w for w in plan.warnings)


def test_no_gradient_checkpointing_costs_more_activations():
    spec = seed_spec()
    with_gc = plan_from_spec(spec)
    spec["trainerArgs"]["gradient_checkpointing"] = False
    without = plan_from_spec(spec)
    assert term(without, "training", "activations") > 5 * term(with_gc, "training", "activations")


def test_local_config_json(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 896,
                "num_hidden_layers": 24,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "intermediate_size": 4864,
                "vocab_size": 151936,
                "tie_word_embeddings": True,
                "max_position_embeddings": 32768,
            }
        )
    )
    # relative path resolved against the job file's directory
    plan = plan_from_spec({"model": {"name": "my-model"}, "vllm": {"maxModelLen": 1024}}, base_dir=tmp_path)
    assert plan.fits
    assert "config.json" in plan.inputs.shape.source
    # same shape as Qwen2.5-0.5B (qwen2 model_type -> q/k/v biases): 494,032,768 parameters
    assert plan.inputs.parameter_count == 494_032_768
    (model_dir / "config.json").unlink()
    with pytest.raises(PlanInputError) as error:
        plan_from_spec({"model": {"name": str(model_dir)}})
    assert error.value.field == "spec.model.name" and "config.json" in error.value.message


def test_unknown_model_needs_parameter_count():
    with pytest.raises(PlanInputError) as error:
        plan_from_spec({"model": {"name": "acme/mystery-9b"}})
    assert error.value.field == "spec.model.name"
    assert "spec.model.parameterCount" in error.value.message and "Qwen2.5" in error.value.message


def test_parameter_count_gives_an_approximate_plan():
    plan = plan_from_spec(
        {
            "model": {"name": "acme/mystery-9b", "parameterCount": 9_000_000_000},
            "resources": {"gpusPerNode": 8},
            "vllm": {"maxModelLen": 2048},
        }
    )
    assert plan.inputs.shape.approximate
    assert plan.inputs.parameter_count == pytest.approx(9e9, rel=0.05)
    assert any("approximate" in w for w in plan.warnings)
    assert plan.to_dict()["approximate"] is True


def test_bad_parameter_count_names_the_field():
    with pytest.raises(PlanInputError) as error:
        plan_from_spec({"model": {"name": "acme/mystery", "parameterCount": "lots"}})
    assert error.value.field == "spec.model.parameterCount"


def test_gpu_memory_override_flag_then_annotation_then_default():
    job = {"metadata": {"annotations": {GPU_MEMORY_ANNOTATION: "80"}}, "spec": seed_spec()}
    assert plan_job(job).gpu_memory_gib == 80.0
    assert plan_job(job, gpu_memory_gib=94.0).gpu_memory_gib == 94.0
    assert plan_job({"spec": seed_spec()}).gpu_memory_gib == DEFAULT_GPU_MEMORY_GIB
    job["metadata"]["annotations"][GPU_MEMORY_ANNOTATION] = "eighty"
    with pytest.raises(PlanInputError) as error:
        plan_job(job)
    assert GPU_MEMORY_ANNOTATION in error.value.field


def test_seed_does_not_fit_on_40_gib_gpus():
    plan = plan_from_spec(seed_spec(), gpu_memory_gib=40)
    assert not plan.fits
    assert any(p.startswith("training phase needs") for p in plan.problems)


def test_cpu_job_has_nothing_to_plan():
    # no shape needed: an unknown model without parameterCount is fine when nothing runs on a GPU
    plan = plan_from_spec({"model": {"name": "/tmp/some-tiny-test-model"}, "resources": {"gpusPerNode": 0}})
    assert plan.fits and "CPU job" in plan.summary


def test_plan_job_accepts_the_typed_model():
    api = pytest.importorskip("colocgrpo_operator.api")  # the dev venv always has it
    job = api.ColocGRPOJob.model_validate({"metadata": {"name": "seed"}, "spec": seed_spec()})
    typed = plan_job(job)
    assert typed.fits
    assert typed.per_gpu_generation_gib == pytest.approx(plan_from_spec(seed_spec()).per_gpu_generation_gib)


def test_lines_and_dict_render():
    plan = plan_from_spec(seed_spec())
    lines = plan.lines()
    assert lines[0].startswith("Qwen/Qwen2.5-14B-Instruct fits")
    assert any("recommended gpuMemoryUtilization" in line for line in lines)
    assert json.loads(json.dumps(plan.to_dict()))["fits"] is True
    assert plan.condition_message().startswith("Qwen/Qwen2.5-14B-Instruct fits")


def test_planner_imports_no_torch():
    code = (
        "import sys, colocgrpo_training.planner as p; "
        "bad = [m for m in ('torch', 'transformers', 'vllm', 'trl', 'deepspeed') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(
        [
            "Qwen/Qwen2.5-0.5B",
            "Qwen/Qwen2.5-7B",
            "Qwen/Qwen2.5-32B",
            "meta-llama/Llama-3.1-8B",
            "HuggingFaceTB/SmolLM2-360M",
        ]
    ),
    gpus=st.sampled_from([1, 2, 4, 8]),
    tp=st.sampled_from([1, 2, 4]),
    util=st.floats(min_value=0.05, max_value=0.95),
    batch=st.integers(min_value=1, max_value=32),
    completion=st.integers(min_value=16, max_value=4096),
    zero=st.integers(min_value=0, max_value=3),
    offload=st.booleans(),
    sleep=st.sampled_from(["off", "level1", "level2", "auto"]),
)
def test_verdict_is_consistent_with_the_numbers(model, gpus, tp, util, batch, completion, zero, offload, sleep):
    spec = {
        "model": {"name": model},
        "resources": {"gpusPerNode": gpus},
        "vllm": {
            "tensorParallelSize": min(tp, gpus),
            "gpuMemoryUtilization": util,
            "sleepPolicy": sleep,
            "maxModelLen": 512 + completion,
        },
        "dataset": {"maxPromptTokens": 512},
        "deepspeed": {"zeroStage": zero, "offloadOptimizer": "cpu" if offload and zero else "none"},
        "trainerArgs": {"per_device_train_batch_size": batch, "max_completion_length": completion},
    }
    plan = plan_from_spec(spec)
    within = (
        plan.per_gpu_training_gib <= plan.gpu_memory_gib
        and plan.per_gpu_generation_gib <= plan.gpu_memory_gib
        and plan.per_gpu_vllm_gib >= plan.vllm_minimum_gib
    )
    assert plan.fits == (within and plan.recommended_gpu_memory_utilization is not None)
    assert plan.fits == (not plan.problems)
    if plan.recommended_gpu_memory_utilization is not None:
        low, high = plan.utilization_range
        assert low <= plan.recommended_gpu_memory_utilization <= high
        # planning again at the recommendation never fails on vLLM's side
        spec["vllm"]["gpuMemoryUtilization"] = plan.recommended_gpu_memory_utilization
        again = plan_from_spec(spec)
        assert not any("vLLM does not fit" in p or "generation phase" in p for p in again.problems)
