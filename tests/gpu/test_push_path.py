"""The weight push's no-gather source is the trainer's current weights (GPU).

`whole_tensor_without_gather` hands vLLM a view of a one-way ZeRO-3 partition instead of
all-gathering it. That is only right if the partition is the storage DeepSpeed's optimizer
updates. Here a real DeepSpeed ZeRO-3 engine (one process, bf16, torch AdamW as TRL uses)
trains SmolLM2-135M for a few steps; after each step every parameter's view must equal,
bit for bit, what `GatheredParameters` returns, and must have moved since the step before
(a stale view would fail the second check). Also prints the time of both sources.

Environment: COLOCGRPO_TEST_MODEL (default /tmp/models/smollm2-135m-instruct),
COLOCGRPO_RESULTS_DIR (writes push_path.json), COLOCGRPO_REQUIRE_GPU=1 (fail, not skip).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from colocgrpo_dev.ports import free_port
from support.gpu_requirements import require_cuda_deepspeed

pytestmark = pytest.mark.gpu


torch, deepspeed = require_cuda_deepspeed()

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")
STEPS = 3
# The ZeRO-3 layout the views are read from: "product" keeps every parameter resident, as the
# operator renders a one-GPU job (render/launch_config.py); "plain" is DeepSpeed's default,
# which releases parameters above 100k elements after each use.
ZERO3_LAYOUT = os.environ.get("COLOCGRPO_PUSH_ZERO3_LAYOUT", "product")


def _zero_section() -> dict:
    if ZERO3_LAYOUT == "plain":
        return {"stage": 3}
    from colocgrpo_training.planner.zero3 import EVERY_PARAMETER

    return {"stage": 3, "stage3_param_persistence_threshold": EVERY_PARAMETER}


@pytest.fixture(scope="module")
def zero3_engine():
    from transformers import AutoModelForCausalLM

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    deepspeed.init_distributed(dist_backend="nccl")
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": _zero_section(),
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    yield engine
    torch.distributed.destroy_process_group()


def _gathered(params) -> list[torch.Tensor]:
    with deepspeed.zero.GatheredParameters(params):
        return [p.data.clone() for p in params]


def _gather_only(params) -> None:
    with deepspeed.zero.GatheredParameters(params):
        pass


def _time(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def test_partition_view_is_the_current_weight(zero3_engine):
    from colocgrpo_training.generation.vllm_engine import whole_tensor_without_gather

    engine = zero3_engine
    params = [p for _, p in engine.module.named_parameters()]
    assert all(getattr(p, "ds_zero_partition_world_size", None) == 1 for p in params), "not a one-way ZeRO-3 run"
    persistent = sum(bool(getattr(p, "ds_persist", False)) for p in params)
    print(f"zero3 layout {ZERO3_LAYOUT}: {persistent}/{len(params)} parameters persistent")
    if ZERO3_LAYOUT == "product":
        assert persistent == len(params), "the one-GPU render should keep every parameter resident"
    else:
        assert persistent < len(params), "the plain layout should release the large parameters"
    torch.manual_seed(0)
    previous = None
    for step in range(STEPS):
        ids = torch.randint(0, 1000, (2, 32), device=engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        views = [whole_tensor_without_gather(p) for p in params]
        assert all(v is not None for v in views), "a one-way partition went through the gather path"
        gathered = _gathered(params)
        mismatched = [
            i
            for i, (v, g) in enumerate(zip(views, gathered, strict=False))
            if v.shape != g.shape or not torch.equal(v, g)
        ]
        assert not mismatched, f"step {step}: {len(mismatched)} views differ from the gathered weights"
        current = [v.clone() for v in views]
        if previous is not None:
            moved = sum(not torch.equal(a, b) for a, b in zip(previous, current, strict=False))
            assert moved >= 0.9 * len(params), f"step {step}: only {moved}/{len(params)} parameters moved"
        previous = current

    gather_s = _time(lambda: _gather_only(params))
    view_s = _time(lambda: [whole_tensor_without_gather(p) for p in params])
    result = {"parameters": len(params), "steps": STEPS, "gather_seconds": gather_s, "view_seconds": view_s}
    print(
        f"push source for {len(params)} parameters: GatheredParameters {gather_s:.4f} s, partition views {view_s:.4f} s"
    )
    out = os.environ.get("COLOCGRPO_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "push_path.json").write_text(json.dumps(result, indent=2))
