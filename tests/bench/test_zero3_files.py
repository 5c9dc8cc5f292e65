"""bench/zero3_train_step.py measures the DeepSpeed files it says it measures: its `product`
is the operator's one-GPU render, `planned` the multi-GPU render, and `auto` transformers' "auto"
values resolved for the same model."""

from __future__ import annotations

from bench import zero3_train_step as zero3
from bench.machine_job import machine_job
from colocgrpo_operator.render import deepspeed_config
from colocgrpo_training.planner.shapes import builtin_shape

# The example job's model (machine_job), whose shape the operator's render finds in the planner's table.
SHAPE = builtin_shape("Qwen/Qwen2.5-14B-Instruct")


def rendered_zero(gpus: int) -> dict:
    zero = deepspeed_config(machine_job(gpus=gpus))["zero_optimization"]
    # Offload blocks with device "none" and the save-time gather change nothing in a step.
    for key in ("offload_optimizer", "offload_param", "stage3_gather_16bit_weights_on_model_save"):
        zero.pop(key)
    return zero


def test_product_and_planned_are_the_operators_renders():
    assert SHAPE is not None
    sections = zero3.zero_sections(SHAPE)
    assert set(sections) == set(zero3.FILES)
    assert sections["product"] == rendered_zero(gpus=1)
    assert sections["planned"] == rendered_zero(gpus=2)
    assert "auto" not in sections["planned"].values()  # every knob sized: the file says what runs
    h = SHAPE.hidden_size
    # transformers' "auto": the planned file differs from it in the gradient bucket only.
    assert {k: v for k, v in sections["auto"].items() if sections["planned"][k] != v} == {"reduce_bucket_size": h * h}
    assert sections["planned"]["reduce_bucket_size"] == SHAPE.layer_parameters()
    assert sections["plain"] == {"stage": 3}
    # Each intermediate file adds one knob of the product's.
    assert set(sections["persist-nomel"]) - set(sections["persist"]) == {"memory_efficient_linear"}
