"""TORCH_CUDA_ARCH_LIST values that DeepSpeed 0.19's op builder cannot parse are made readable."""

from __future__ import annotations

import pytest

from colocgrpo_training.cuda_arch import deepspeed_readable, make_arch_list_deepspeed_readable


@pytest.mark.parametrize(
    ("given", "readable"),
    [
        ("9.0a", "9.0"),
        ("8.0;9.0a+PTX", "8.0;9.0+PTX"),
        ("9.0 9.0a 10.0f", "9.0;10.0"),
        ("8.6;9.0", "8.6;9.0"),
    ],
)
def test_suffixes_dropped_order_kept(given, readable):
    assert deepspeed_readable(given) == readable
    # what DeepSpeed 0.19.8's builder does with the value (op_builder/builder.py)
    parts = readable.split(";")
    assert sorted(parts, key=lambda cc: tuple(int(part.split("+")[0]) for part in cc.split(".")))


def test_environment_rewritten_only_when_needed():
    env = {"TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert make_arch_list_deepspeed_readable(env) == "9.0"
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert make_arch_list_deepspeed_readable(env) is None
    assert make_arch_list_deepspeed_readable({}) is None
