"""The micro-batch merge rule (planner/micro_batches.py): which settings give the same step, which factors divide,
and the memory plan's verdicts, the 7.18B benchmark shape among them."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re

import pytest

from colocgrpo_training.planner.micro_batches import (
    EXACT_LOSS_TYPES,
    INEXACT_LOSS_TYPES,
    MicroBatchMerge,
    batch_shape,
    exactness_problems,
    factors,
    plan_micro_batches,
)
from colocgrpo_training.planner.plan import plan_inputs
from support import bench_7b
from support.planning import inputs_from_spec, plan_from_spec

LARGE = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "steps_per_generation": 8}


def test_loss_types_are_exact_except_bnpo():
    for loss_type in EXACT_LOSS_TYPES:
        assert exactness_problems({"loss_type": loss_type}) == [], loss_type
    assert exactness_problems({}) == []  # TRL's default loss_type dapo
    assert exactness_problems({"loss_type": "bnpo"}) == [
        "loss_type bnpo divides each micro-batch by its own token count"
    ]
    assert "is not one whose normalisation this rule knows" in exactness_problems({"loss_type": "new_in_trl_1_17"})[0]


def test_every_loss_type_trl_computes_is_classified():
    trl = pytest.importorskip("trl")
    source = inspect.getsource(trl.GRPOTrainer._compute_loss)
    named = set(re.findall(r'"([a-z_]+)"', " ".join(re.findall(r"self\.loss_type (?:==|in) ([^:]+):", source))))
    assert {"grpo", "bnpo", "dapo", "vespo"} <= named
    assert named == set(EXACT_LOSS_TYPES) | set(INEXACT_LOSS_TYPES)


@pytest.mark.parametrize(
    ("settings", "model_config", "why"),
    [
        ({"top_entropy_quantile": 0.2}, None, "entropy quantile over each micro-batch"),
        ({"entropy_coef": 0.01}, None, "entropy bonus"),
        ({"use_adaptive_entropy": True}, None, "entropy bonus"),
        ({}, {"num_local_experts": 8, "output_router_logits": False}, "router loss"),
        ({}, {"text_config": {"num_experts": 64}}, "router loss"),
        ({}, {"attention_dropout": 0.1}, "dropout (attention_dropout 0.1)"),
        ({}, {"resid_pdrop": 0.1, "embd_pdrop": 0.0}, "dropout (resid_pdrop 0.1)"),
    ],
)
def test_options_that_change_the_step(settings, model_config, why):
    (problem,) = exactness_problems(settings, model_config)
    assert why in problem
    assert plan_micro_batches({**LARGE, **settings}, None, pin="auto", model_config=model_config).factor == 1


def test_options_that_keep_the_step():
    kept = {"top_entropy_quantile": 1.0, "entropy_coef": 0.0, "num_iterations": 2, "beta": 0.04, "delta": 2.0}
    assert exactness_problems(kept, {"attention_dropout": 0.0, "hidden_act": "silu"}) == []
    # a Mixture-of-Experts model whose router loss is switched off
    assert exactness_problems({"router_aux_loss_coef": 0.0}, {"num_experts": 64}) == []


def test_factors_divide_accumulation_and_generation_steps():
    assert factors(4, 8) == [4, 2, 1]
    assert factors(6, 4) == [2, 1]
    assert factors(3, 8) == [1]
    assert factors(1, 1) == [1]


def test_batch_shape_resolves_steps_per_generation_as_trl_does():
    assert batch_shape({}, 1) == (8, 1, 1)  # TRL/transformers defaults: S = G
    assert batch_shape({"gradient_accumulation_steps": 4}, 1) == (8, 4, 4)
    assert batch_shape({"per_device_train_batch_size": 16, "generation_batch_size": 256}, 2) == (16, 1, 8)


def test_rewrite_keeps_the_rows_per_step_and_generation():
    merge = MicroBatchMerge(2, 16, 4, 8, "test")
    assert merge.rewrite(LARGE) == {
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 4,
    }
    # unset steps_per_generation stays unset: TRL derives S/k from G (or from generation_batch_size)
    derived = merge.rewrite({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4})
    assert "steps_per_generation" not in derived
    assert merge.rewrite({**LARGE, "loss_type": "dapo"})["loss_type"] == "dapo"
    assert MicroBatchMerge(1, 16, 4, 8, "kept").rewrite(LARGE) == LARGE


def test_rewritten_settings_are_what_grpoconfig_accepts(tmp_path):
    trl = pytest.importorskip("trl")
    common = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "report_to": [], "num_generations": 8}
    by_generation_batch = {
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 2,
        "generation_batch_size": 128,
    }
    for settings, k in ((LARGE, 4), (by_generation_batch, 2)):
        before = trl.GRPOConfig(**common, **settings)
        merge = plan_micro_batches(settings, None, pin=k)
        after = trl.GRPOConfig(**common, **merge.rewrite(settings))
        assert after.generation_batch_size == before.generation_batch_size == 128
        assert after.per_device_train_batch_size == before.per_device_train_batch_size * k
        assert after.gradient_accumulation_steps * k == before.gradient_accumulation_steps
        assert after.steps_per_generation * k == before.steps_per_generation == 8


def test_pins():
    assert plan_micro_batches(LARGE, None, pin="off").factor == 1
    pinned = plan_micro_batches(LARGE, None, pin=4)
    assert pinned.factor == 4 and "pinned" in pinned.reason
    with pytest.raises(ValueError, match="must divide gradient_accumulation_steps 4 and steps_per_generation 8"):
        plan_micro_batches(LARGE, None, pin=8)
    with pytest.raises(ValueError, match="would change the step: loss_type bnpo"):
        plan_micro_batches({**LARGE, "loss_type": "bnpo"}, None, pin=2)
    assert plan_micro_batches({**LARGE, "loss_type": "bnpo"}, None, pin=1).factor == 1


def test_no_plan_no_merge():
    merge = plan_micro_batches(LARGE, None, no_plan_reason="no memory plan: no CUDA device")
    assert merge.factor == 1 and merge.reason == "no memory plan: no CUDA device"
    assert "kept at 16 rows (4 per optimizer step)" in merge.message()
    assert plan_micro_batches({"gradient_accumulation_steps": 3, "steps_per_generation": 8}, None).reason == (
        "gradient_accumulation_steps 3 and steps_per_generation 8 have no common factor"
    )


# ------------------------------------------------------------------ memory: the 7.18B benchmark shape
def test_7b_as_measured_merges_two_not_four(tmp_path):
    # The measurement (bench/results/zero3-variants-5a462f3.md): 2 x 32 rows fit at 129.4 GiB, 1 x 64 ran out
    # of 139.8 GiB. It ran without checkpointing in effect (eval mode): plan that.
    inputs = inputs_from_spec(bench_7b.spec(tmp_path, checkpointing=False))
    merge = plan_micro_batches(bench_7b.trainer_args(checkpointing=False), inputs)
    assert merge.factor == 2
    peaks = dict(merge.peaks_gib)
    assert peaks[4] > 139.8 > merge.limit_gib >= peaks[2]
    assert merge.limit_gib == pytest.approx(0.95 * 139.8)
    assert "merging 4 would need 152.6 GiB" in merge.reason
    assert merge.message().startswith("training micro-batches merged 2 into 1: 2 x 32 rows per optimizer step")


def test_7b_as_trained_merges_all_four(tmp_path):
    # TRL trains in training mode, so checkpointing applies: 64 rows hold 3.3 GiB of activations, under the
    # optimizer step's 6.7 GiB; the training peak does not grow at all from 16 to 64 rows.
    inputs = inputs_from_spec(bench_7b.spec(tmp_path))
    merge = plan_micro_batches(bench_7b.trainer_args(), inputs)
    assert merge.factor == 4
    assert merge.rewrite(bench_7b.trainer_args())["per_device_train_batch_size"] == 64
    ((k, peak),) = merge.peaks_gib
    assert k == 4 and peak == pytest.approx(plan_from_spec(bench_7b.spec(tmp_path)).per_gpu_training_gib)
    assert peak < merge.limit_gib


def test_no_headroom_keeps_the_micro_batch(tmp_path):
    # on an 80 GiB GPU the 7.18B trainer's 107 GiB of states do not fit even unmerged
    inputs = inputs_from_spec(bench_7b.spec(tmp_path), gpu_memory_gib=80.0)
    merge = plan_micro_batches(bench_7b.trainer_args(), inputs)
    assert merge.factor == 1 and "unmerged, over 76.0 GiB" in merge.reason
    assert [k for k, _ in merge.peaks_gib] == [4, 2, 1]


def test_an_inexact_setting_is_never_merged_whatever_the_room(tmp_path):
    inputs = inputs_from_spec(bench_7b.spec(tmp_path))
    merge = plan_micro_batches({**bench_7b.trainer_args(), "loss_type": "bnpo"}, inputs)
    assert merge.factor == 1 and merge.peaks_gib == ()


# ------------------------------------------------------------------ memory: gradient checkpointing left to the planner
def unset_checkpointing(args: dict) -> dict:
    return {key: value for key, value in args.items() if key != "gradient_checkpointing"}


def spec_3b(tmp_path) -> dict:
    """The bench's `large` size as an 80 GiB GPU builds it: the 2.97B Llama shape, vLLM at 0.34."""
    spec = bench_7b.spec(tmp_path)
    config = {**bench_7b.CONFIG, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28}
    (tmp_path / "random-large" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 24}))
    spec["vllm"]["gpuMemoryUtilization"] = 0.34
    spec["trainerArgs"] = unset_checkpointing(spec["trainerArgs"])
    return spec


def test_checkpointing_left_unset_goes_off_where_the_merged_activations_fit(tmp_path):
    spec = spec_3b(tmp_path)
    args = spec["trainerArgs"]
    merge = plan_micro_batches(args, inputs_from_spec(spec, gpu_memory_gib=79.2))
    # merged first (64 rows: 53.9 GiB with the recompute), then the recompute off: 72.0 GiB within 75.2
    assert merge.factor == 4 and merge.recompute_off and merge.recompute is not None
    assert merge.recompute.peak_gib == pytest.approx(72.0, abs=0.05)
    assert merge.peaks_gib[0][1] < merge.recompute.peak_gib <= merge.limit_gib
    assert merge.trainer_options() == {}  # GRPOConfig's gradient_checkpointing says it all
    assert merge.rewrite(args) == {
        **args,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,
        "gradient_checkpointing": False,
    }
    assert merge.message().endswith(
        "gradient checkpointing off: every layer's activations fit (training peak 72.0 GiB within 75.2 GiB without "
        "it), so the backward recomputes no forward"
    )
    assert merge.to_dict()["recompute"] == {"checkpointed_layers": 0, "layers": 28, "training_peak_gib": 72.03}
    # the plan's own peak without the recompute is what the decision read
    no_recompute = {**spec, "trainerArgs": {**merge.rewrite(args)}}
    assert plan_from_spec(no_recompute, gpu_memory_gib=79.2).per_gpu_training_gib == pytest.approx(
        merge.recompute.peak_gib
    )


def test_checkpointing_stays_where_memory_needs_it_or_the_job_sets_it(tmp_path):
    # 7.18B on an H200: 64 rows without the recompute would need 152.6 GiB, so the merge wins over dropping it; the
    # fewest checkpointed layers that fit are the first 17 of 32 (131.8 GiB within 132.8; 16 would need more)
    seven = bench_7b.spec(tmp_path)
    args = unset_checkpointing(seven["trainerArgs"])
    inputs = inputs_from_spec({**seven, "trainerArgs": args})
    merge = plan_micro_batches(args, inputs)
    assert merge.factor == 4 and not merge.recompute_off and merge.recompute is not None
    assert (merge.recompute.checkpointed_layers, merge.recompute.num_layers) == (17, 32)
    assert merge.recompute.peak_gib == pytest.approx(131.84, abs=0.01) and merge.recompute.peak_gib <= merge.limit_gib
    merged = dataclasses.replace(inputs, per_device_train_batch_size=64, steps_per_generation=2)
    assert plan_inputs(dataclasses.replace(merged, checkpointed_layers=16)).per_gpu_training_gib > merge.limit_gib
    assert plan_inputs(dataclasses.replace(merged, checkpointed_layers=0)).per_gpu_training_gib == pytest.approx(
        152.56, abs=0.01
    )
    # GRPOConfig keeps checkpointing on; the trainer keeps the last 15 layers whole
    assert "gradient_checkpointing" not in merge.rewrite(args) and "gradient_checkpointing_kwargs" not in merge.rewrite(
        args
    )
    assert merge.trainer_options() == {"checkpointed_layers": 17}
    assert merge.message().endswith(
        "gradient checkpointing on the first 17 of 32 layers: the last 15 keep their activations (training peak "
        "131.8 GiB within 132.8 GiB), so the backward recomputes 17 layers' forwards instead of 32"
    )
    assert merge.to_dict()["recompute"] == {"checkpointed_layers": 17, "layers": 32, "training_peak_gib": 131.84}
    # a job that checkpoints every n-th layer itself is planned with ceil(32 / n) checkpointed layers
    every_4th = {**args, "gradient_checkpointing_kwargs": {"every_n_layers": 4}}
    assert inputs_from_spec({**seven, "trainerArgs": every_4th}).checkpointed_layers == 8
    unchecked = {**args, "gradient_checkpointing": False}
    assert inputs_from_spec({**seven, "trainerArgs": unchecked}).checkpointed_layers == 0
    assert inputs.checkpointed_layers == 32
    # the 2.97B shape where it would go off, but the job says so either way, or says how to checkpoint
    spec = spec_3b(tmp_path)
    for value in (True, False):
        args = {**spec["trainerArgs"], "gradient_checkpointing": value}
        merge = plan_micro_batches(args, inputs_from_spec({**spec, "trainerArgs": args}, gpu_memory_gib=79.2))
        assert merge.factor == 4 and merge.recompute is None
        assert merge.rewrite(args)["gradient_checkpointing"] is value
    args = {**spec["trainerArgs"], "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    merge = plan_micro_batches(args, inputs_from_spec({**spec, "trainerArgs": args}, gpu_memory_gib=79.2))
    assert merge.factor == 4 and merge.recompute is None and "gradient_checkpointing" not in merge.rewrite(args)
    # no memory plan, a pinned factor, merging off: nothing decided about memory, nothing about the recompute
    args = spec["trainerArgs"]
    inputs = inputs_from_spec(spec, gpu_memory_gib=79.2)
    for merge in (
        plan_micro_batches(args, None),
        plan_micro_batches(args, inputs, pin=2),
        plan_micro_batches(args, inputs, pin="off"),
    ):
        assert merge.recompute is None and "gradient_checkpointing" not in merge.rewrite(args)
    # an unmerged micro-batch (bnpo) still drops the recompute where it fits
    merge = plan_micro_batches({**args, "loss_type": "bnpo"}, inputs)
    assert merge.factor == 1 and merge.recompute_off and merge.changes
