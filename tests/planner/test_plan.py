"""Whole plans: verdicts, the terms they name, the recommendation, and the inputs they read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colocgrpo_operator.api import GPU_MEMORY_ANNOTATION
from colocgrpo_operator.render import plan_job
from colocgrpo_training.planner import DEFAULT_GPU_MEMORY_GIB, PlanInputError
from colocgrpo_training.planner import formulas as f
from support import bench_7b
from support.planning import plan_from_spec

GIB = 1024**3
REPO = Path(__file__).resolve().parents[2]
# Qwen2.5-14B's decoder layer: q, o 5120²; k, v 5120 x 1024 (+ biases); gate, up, down 5120 x 13824; two norms.
QWEN14B_LAYER = 2 * 5120 * 5120 + 2 * 5120 * 1024 + (5120 + 2 * 1024) + 3 * 5120 * 13824 + 2 * 5120


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


@pytest.mark.parametrize("gpu_gib", [139.8, 80.0, 40.0])
def test_seed_job_merges_micro_batches_only_where_the_1536_token_activations_fit(gpu_gib):
    plan = plan_from_spec(seed_spec(), gpu_memory_gib=gpu_gib)
    merge = plan.micro_batches
    assert merge is not None and merge.limit_gib == pytest.approx(0.95 * gpu_gib)
    assert plan.inputs is not None and plan.inputs.sequence_tokens == 1536
    peaks = dict(merge.peaks_gib)
    # The factor taken fits; every larger factor of G 4 and S 4 was tried and did not.
    assert merge.factor in (4, 2, 1) and max(peaks) == 4
    if merge.factor > 1:
        assert peaks[merge.factor] <= merge.limit_gib
    assert all(peaks[k] > merge.limit_gib for k in peaks if k > merge.factor)
    # The unmerged training phase is the plan's own; merged ones hold k x 16 rows of 1536 tokens.
    if 1 in peaks:
        assert peaks[1] == pytest.approx(plan.per_gpu_training_gib)
    text = "\n".join(plan.lines())
    assert merge.message() in text and plan.to_dict()["microBatches"]["factor"] == merge.factor


def test_seed_job_on_h200s_merges_four_and_a_40_gib_gpu_merges_none():
    assert plan_from_spec(seed_spec()).micro_batches.factor == 4
    small = plan_from_spec(seed_spec(), gpu_memory_gib=40.0).micro_batches
    assert small.factor == 1 and "over" in small.reason
    pinned = seed_spec()
    pinned["training"] = {"microBatchMerge": "off"}
    assert plan_from_spec(pinned).micro_batches.factor == 1


def test_seed_job_fits_with_numbers():
    plan = plan_from_spec(seed_spec())
    assert plan.fits, plan.problems
    assert plan.gpu_memory_gib == DEFAULT_GPU_MEMORY_GIB
    # vLLM's reservation is a fraction of the WHOLE GPU: 0.35 x 139.8 GiB = 48.93 GiB
    assert plan.per_gpu_vllm_gib == pytest.approx(0.35 * 139.8, abs=0.01)
    # model states in training (DeepSpeed's estimator): 18 x 14,770,033,664 / 8 bytes = 30.95 GiB
    p = 14_770_033_664
    assert term(plan, "training", "optimizer") == 12 * p // 8
    # the reduce bucket: one decoder layer, 275,268,608 elements x 2 B = 550,537,216 B
    bucket = QWEN14B_LAYER * 2
    assert bucket == 550_537_216
    assert term(plan, "training", "ZeRO-3 gradient bucket") == bucket
    # while vLLM generates, ZeRO-3's buffers between steps, all kept on the GPU: bf16 partitions and
    # gradients 2 + 2, fp32 master + Adam m, v 4 + 8 bytes/param / 8 GPUs, and the bucket
    assert term(plan, "generation", "trainer optimizer") == 12 * p // 8
    assert term(plan, "generation", "trainer parameters + gradients") == 2 * (2 * p // 8)
    expected_generation = int(0.35 * int(139.8 * GIB)) + 2 * (2 * p // 8) + 12 * p // 8 + bucket + f.CUDA_CONTEXT_BYTES
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


def test_offload_trainer_state_frees_what_deepspeed_moves_during_generation():
    kept = plan_from_spec(seed_spec())
    moved = plan_from_spec(seed_spec(offloadTrainerState=True))
    p = 14_770_033_664
    # offload_states with DeepSpeed's FusedAdam (rendered for the offload) moves every ZeRO-3 buffer:
    # bf16 partitions 2P/8, bf16 gradients 2P/8, fp32 master 4P/8, Adam m, v 8P/8, and the one-layer bucket
    everything = 2 * p // 8 + 2 * p // 8 + 4 * p // 8 + 8 * p // 8 + QWEN14B_LAYER * 2
    assert moved.trainer_state_offload_gib * GIB == pytest.approx(everything)
    assert (kept.per_gpu_generation_gib - moved.per_gpu_generation_gib) * GIB == pytest.approx(everything)
    for name in ("trainer parameters + gradients", "trainer optimizer", "ZeRO-3 gradient bucket"):
        assert term(moved, "generation", name) == 0
    assert moved.utilization_range[1] > kept.utilization_range[1]
    assert kept.trainer_state_offload_gib == 0
    assert any("pinned host memory" in a and "per node" in a for a in moved.assumptions)


def test_offload_with_optimizer_on_cpu_moves_only_the_bf16_partitions_and_bucket():
    spec = seed_spec(offloadTrainerState=True)
    spec["deepspeed"] = {"zeroStage": 3, "offloadOptimizer": "cpu"}
    moved = plan_from_spec(spec)
    p = 14_770_033_664
    # DeepSpeed drops hp_params, optim_states and lp_grads from the offload: they live on the CPU already
    assert moved.trainer_state_offload_gib * GIB == pytest.approx(2 * p // 8 + QWEN14B_LAYER * 2)
    assert term(moved, "generation", "trainer parameters + gradients") == 0


@pytest.mark.parametrize(
    "deepspeed, vllm",
    [
        ({"zeroStage": 2}, {}),
        ({"zeroStage": 3, "offloadParams": "cpu", "offloadOptimizer": "cpu"}, {}),
        ({}, {"sleepPolicy": "off"}),
    ],
)
def test_a_refused_offload_is_credited_nothing(deepspeed, vllm):
    spec = seed_spec(offloadTrainerState=True, **vllm)
    spec["deepspeed"].update(deepspeed)
    plan = plan_from_spec(spec)
    without = seed_spec(**vllm)
    without["deepspeed"].update(deepspeed)
    assert plan.per_gpu_generation_gib == plan_from_spec(without).per_gpu_generation_gib
    assert plan.trainer_state_offload_gib == 0
    assert any("offloadTrainerState" in w and "refused" in w for w in plan.warnings)


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


@pytest.mark.parametrize(("rows", "measured_gib"), [(16, 119.3), (32, 129.4), (64, None)])
def test_zero3_training_peak_matches_the_7b_measurement(rows, measured_gib, tmp_path):
    # bench.zero3_train_step --variants at commit 5a462f3, one H200 (bench/results/zero3-variants-5a462f3.md):
    # one optimizer step of 64 rows x 104 tokens as micro-batches of 16 and 32 rows peaked at 119.3 and 129.4 GiB
    # allocated; 64 rows ran out of the 139.8 GiB. The model was still in eval mode there, where transformers skips
    # checkpointing, so these are activations without it; nothing but the trainer was on the GPU.
    plan = plan_from_spec(bench_7b.spec(tmp_path, rows, checkpointing=False))
    p = bench_7b.PARAMETERS
    assert plan.inputs.parameter_count == p
    # between steps ZeRO-3 holds 16 bytes a parameter (the planner's generation-phase buffers): 107.0 GiB
    assert term(plan, "training", "gradients") == 2 * p
    beside_torch = f.CUDA_CONTEXT_BYTES + f.vllm_sleep_residual_bytes(1)  # not in max_memory_allocated
    allocated_gib = plan.per_gpu_training_gib - beside_torch / GIB
    if measured_gib is None:
        assert allocated_gib > 139.8
    else:
        # within 1 GiB: the planner's 4-byte-per-element gather allowance for the embedding (0.75 GiB) has no
        # counterpart here, where every parameter stays resident
        assert 0 <= allocated_gib - measured_gib < 1.0
    # the backward, not the optimizer step, is the peak at these sizes without checkpointing
    assert term(plan, "training", "ZeRO-3 step beyond the backward") == 0


def test_zero3_step_is_the_peak_when_activations_are_small(tmp_path):
    # with checkpointing 16 rows hold 1.7 GiB of activations and LM head; the step's 6.7 GiB of flattened and fp32
    # gradients come after they are freed, so the peak is the step's, whatever the micro-batch up to 64 rows
    plans = [plan_from_spec(bench_7b.spec(tmp_path, rows)) for rows in (16, 32, 64)]
    step = f.zero3_step_bytes(bench_7b.PARAMETERS, 49152 * 4096, 1, 2)
    for plan in plans:
        backward = term(plan, "training", "activations") + term(plan, "training", "LM head")
        assert term(plan, "training", "ZeRO-3 step beyond the backward") == step - backward > 0
    assert plans[0].per_gpu_training_gib == pytest.approx(plans[-1].per_gpu_training_gib)


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


def test_gpu_memory_override_flag_then_spec_then_annotation_then_default():
    job = {"metadata": {"annotations": {GPU_MEMORY_ANNOTATION: "80"}}, "spec": seed_spec()}
    assert plan_job(job).gpu_memory_gib == 80.0
    assert plan_job(job, gpu_memory_gib=94.0).gpu_memory_gib == 94.0
    assert plan_job({"spec": seed_spec()}).gpu_memory_gib == DEFAULT_GPU_MEMORY_GIB
    # The spec's own field wins over the annotation, the flag over both.
    job["spec"]["resources"]["gpuMemoryGiB"] = 79.2
    assert plan_job(job).gpu_memory_gib == 79.2
    assert plan_job(job, gpu_memory_gib=94.0).gpu_memory_gib == 94.0
    del job["spec"]["resources"]["gpuMemoryGiB"]
    job["metadata"]["annotations"][GPU_MEMORY_ANNOTATION] = "eighty"
    with pytest.raises(PlanInputError) as error:
        plan_job(job)
    assert GPU_MEMORY_ANNOTATION in error.value.field


def test_a_utilization_left_out_is_an_assumption():
    unset = seed_spec()
    del unset["vllm"]["gpuMemoryUtilization"]
    assert "gpuMemoryUtilization unset: vLLM gets the default 0.3" in plan_from_spec(unset).assumptions
    assert not any("gpuMemoryUtilization" in a for a in plan_from_spec(seed_spec()).assumptions)


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


@pytest.mark.parametrize(
    "gpus, offload, bucket_elements",
    [(1, False, 500_000_000), (1, True, QWEN14B_LAYER), (8, False, QWEN14B_LAYER), (8, True, QWEN14B_LAYER)],
    ids=["one-gpu", "one-gpu-offload", "eight-gpus", "eight-gpus-offload"],
)
def test_bucket_is_what_the_operator_renders(gpus, offload, bucket_elements):
    """The planner's ZeRO-3 bucket is the one the operator writes into deepspeed.json: DeepSpeed's default for a
    one-GPU job that keeps its parameters resident, one decoder layer's parameters elsewhere; `colocgrpo plan`
    shows it with its reason."""
    import yaml

    from colocgrpo_operator.api import parse_job
    from colocgrpo_operator.render import deepspeed_config

    obj = yaml.safe_load((REPO / "examples" / "seed-qwen14b-tp4.yaml").read_text())
    obj["spec"]["resources"] = {"nodes": 1, "gpusPerNode": gpus}
    obj["spec"]["vllm"].update(tensorParallelSize=1, offloadTrainerState=offload)
    rendered = deepspeed_config(parse_job(obj))["zero_optimization"]
    assert rendered["reduce_bucket_size"] == bucket_elements
    memory = plan_job(obj)
    assert term(memory, "training", "ZeRO-3 gradient bucket") == 2 * bucket_elements
    assert memory.zero3 is not None and memory.zero3.section().items() <= rendered.items()
    assert any("reduce_bucket_size" in line and f"{bucket_elements:,}" in line for line in memory.lines())
    assert memory.to_dict()["zero3"]["knobs"][0] == {
        "key": "reduce_bucket_size",
        "value": bucket_elements,
        "why": memory.zero3.knobs[0].why,
    }


def test_an_unknown_shape_leaves_the_shape_sized_knobs_to_transformers():
    """A model the planner cannot size (not in its table, no config.json, no parameter count) still renders: the
    shape-sized knobs are transformers' "auto", which transformers fills once the model is loaded."""
    import yaml

    from colocgrpo_operator.api import parse_job
    from colocgrpo_operator.render import deepspeed_config

    obj = yaml.safe_load((REPO / "examples" / "seed-qwen14b-tp4.yaml").read_text())
    obj["spec"]["model"]["name"] = "/models/an-unknown-model"
    zero = deepspeed_config(parse_job(obj))["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["stage3_param_persistence_threshold"] == "auto"
    assert zero["stage3_prefetch_bucket_size"] == "auto"
    obj["spec"]["model"]["parameterCount"] = 14_770_000_000  # sized from the approximate shape the plan uses too
    zero = deepspeed_config(parse_job(obj))["zero_optimization"]
    assert plan_job(obj).zero3.section().items() <= zero.items()
    assert isinstance(zero["reduce_bucket_size"], int)
