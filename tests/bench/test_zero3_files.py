"""bench/zero3_train_step.py measures the DeepSpeed files it says it measures: its `product`
is the operator's one-GPU render, and `auto` the multi-GPU render, with transformers' "auto"
values resolved."""

from __future__ import annotations

from bench import zero3_train_step as zero3
from bench.machine_job import machine_job
from colocgrpo_operator.render import deepspeed_config

HIDDEN = 4096
RESOLVED_AUTO = {
    "reduce_bucket_size": HIDDEN * HIDDEN,
    "stage3_prefetch_bucket_size": int(0.9 * HIDDEN * HIDDEN),
    "stage3_param_persistence_threshold": 10 * HIDDEN,
}


def rendered_zero(gpus: int) -> dict:
    zero = deepspeed_config(machine_job(gpus=gpus))["zero_optimization"]
    # Offload blocks with device "none" and the save-time gather change nothing in a step.
    for key in ("offload_optimizer", "offload_param", "stage3_gather_16bit_weights_on_model_save"):
        zero.pop(key)
    return {k: RESOLVED_AUTO.get(k, v) if v == "auto" else v for k, v in zero.items()}


def test_product_and_auto_are_the_operators_renders():
    sections = zero3.zero_sections(HIDDEN)
    assert set(sections) == set(zero3.FILES)
    assert sections["product"] == rendered_zero(gpus=1)
    assert sections["auto"] == rendered_zero(gpus=2)
    assert sections["plain"] == {"stage": 3}
    # Each intermediate file adds one knob of the product's.
    assert set(sections["persist-nomel"]) - set(sections["persist"]) == {"memory_efficient_linear"}
