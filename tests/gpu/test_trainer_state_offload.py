"""Trainer-state offload on a GPU, with the deepspeed.json the operator renders for it.

A real DeepSpeed ZeRO-3 engine (one process, bf16) trains SmolLM2-135M under the operator's
rendering of an offloading multi-GPU job — DeepSpeed's own AdamW (FusedAdam), every large
parameter released after use — its "auto" values filled by transformers' own code, with
gradient accumulation 4. At micro-step 2 of 4 (a generation inside accumulation, as with
steps_per_generation < gradient_accumulation_steps) and right after an optimizer step, the
trainer's offload hooks (`ColocatedVLLM._offload_trainer_state` / `_reload_trainer_state`)
move the state out and back. Checked:
- parameters, gradient partitions, fp32 masters and Adam moments are bit-identical before the
  offload and after the reload, and the run ends bit-identical to a twin run without offloads
  (a second twin checks that the kernels are deterministic at all);
- memory allocated drops by what the planner credits (`formulas.Zero3Resident`), within 1 %;
- while offloaded, a forward pass and a weight push raise instead of reading wrong weights.

Environment: COLOCGRPO_TEST_MODEL (default /tmp/models/smollm2-135m-instruct),
COLOCGRPO_RESULTS_DIR (writes trainer_state_offload.json), COLOCGRPO_REQUIRE_GPU=1 (fail, not skip).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from support.gpu_requirements import require_cuda_deepspeed

pytestmark = pytest.mark.gpu

# Deterministic cuBLAS for the twin comparison; must be set before CUDA initializes.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

torch, deepspeed = require_cuda_deepspeed()

from bench.machine_job import completed_deepspeed_config  # noqa: E402
from support.zero3_states import (  # noqa: E402
    differences,
    single_process_env,
    snapshot,
    storages,
)

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")
ACCUMULATION = 4
MICRO_STEPS = 8  # two optimizer steps
OFFLOAD_AT = (1, 3)  # after micro-step 2 of 4 (inside accumulation), after the first optimizer step
RESULTS: dict = {"model": MODEL, "offloads": []}


@pytest.fixture(scope="module")
def engines():
    from transformers import AutoModelForCausalLM

    if not Path(MODEL).exists():
        pytest.fail(f"test model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)")
    os.environ.update(single_process_env())
    deepspeed.init_distributed(dist_backend="nccl")
    torch.use_deterministic_algorithms(True, warn_only=True)
    built = []
    for _ in range(3):  # the offloaded run, its twin, and a control twin
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation="eager")
        config = completed_deepspeed_config(
            model,
            offload_trainer_state=True,
            accumulation=ACCUMULATION,
            micro_batch=2,
            steps=MICRO_STEPS // ACCUMULATION,
        )
        start = time.perf_counter()
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config
        )
        RESULTS.setdefault("engine_build_seconds", []).append(time.perf_counter() - start)
        built.append(engine)
    RESULTS["deepspeed_config"] = config
    yield built
    _write_results()
    torch.distributed.destroy_process_group()


def _write_results() -> None:
    out = os.environ.get("COLOCGRPO_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "trainer_state_offload.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def batch(k: int):
    generator = torch.Generator().manual_seed(100 + k)
    return torch.randint(0, 2000, (2, 48), generator=generator).cuda()


def micro_step(engine, k: int) -> None:
    ids = batch(k)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()


def refused(fn) -> bool:
    from colocgrpo_training.generation.vllm_engine import TrainerStateOffloadedError

    try:
        fn()
    except TrainerStateOffloadedError:
        return True
    return False


@pytest.fixture(scope="module")
def scenario(engines):
    """The three runs side by side, the offloaded one through the trainer's offload hooks at OFFLOAD_AT;
    one record per offload (what the tests below judge), written to trainer_state_offload.json."""
    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM, check_trainer_state_offload
    from colocgrpo_training.planner import formulas

    offloaded, twin, control = engines
    check_trainer_state_offload(offloaded)  # the rendered file gives DeepSpeed's FusedAdam
    RESULTS["optimizer"] = type(offloaded.optimizer.optimizer).__name__
    gen = ColocatedVLLM.__new__(ColocatedVLLM)
    gen.settings = VLLMSettings(sleep_policy="level2", offload_trainer_state=True)
    gen.model = offloaded.module
    gen.deepspeed_engine = lambda: offloaded
    gen.offload_seconds = 0.0

    params = sum(p.ds_numel for p in offloaded.module.parameters())
    bucket = offloaded.optimizer.reduce_bucket_size
    planned = formulas.zero3_resident(params, 1, 2, False, False, bucket).moved_by_offload_states(False)
    RESULTS.update(parameters=params, reduce_bucket_size=bucket, planned_bytes=planned)
    for k in range(MICRO_STEPS):
        for engine in engines:
            micro_step(engine, k)
        if k not in OFFLOAD_AT:
            continue
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = snapshot(offloaded)
        held = storages(offloaded)
        allocated_before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        gen._offload_trainer_state()
        offload_s = time.perf_counter() - start
        allocated_offloaded = torch.cuda.memory_allocated()
        moved_states = sorted(s.value for s in offloaded.optimizer.offloaded_states)
        forward_refused = refused(lambda: offloaded(input_ids=batch(k), labels=batch(k)))  # noqa: B023
        push_refused = refused(gen.push_weights)
        start = time.perf_counter()
        gen._reload_trainer_state()
        reload_s = time.perf_counter() - start
        RESULTS["offloads"].append(
            {
                "micro_step": k + 1,
                "inside_accumulation": (k + 1) % ACCUMULATION != 0,
                "accumulated_gradient_abs_sum": float(before["lp_grads[0]"].float().abs().sum()),
                "allocated_before": allocated_before,
                "allocated_offloaded": allocated_offloaded,
                "allocated_after_reload": torch.cuda.memory_allocated(),
                "freed_bytes": allocated_before - allocated_offloaded,
                "planned_bytes": sum(planned.values()),
                "held_bytes_by_state": {s: sum(v.values()) for s, v in held.items()},
                "offloaded_states": moved_states,
                "forward_refused": forward_refused,
                "push_refused": push_refused,
                "offload_seconds": offload_s,
                "reload_seconds": reload_s,
                "changed_after_reload": differences(before, snapshot(offloaded)),
            }
        )
        _write_results()
    RESULTS["control_twins_differences"] = differences(snapshot(twin), snapshot(control))[:20]
    RESULTS["offloaded_vs_twin_differences"] = differences(snapshot(offloaded), snapshot(twin))[:20]
    _write_results()
    return RESULTS


def test_render_trains_with_fused_adam(scenario):
    assert scenario["optimizer"] == "FusedAdam"


def test_reload_is_bit_identical_also_inside_gradient_accumulation(scenario):
    inside, after_step = scenario["offloads"]
    assert inside["inside_accumulation"] and inside["accumulated_gradient_abs_sum"] > 0, inside
    assert not after_step["inside_accumulation"]
    for record in scenario["offloads"]:
        assert record["changed_after_reload"] == [], record


def test_offload_frees_what_the_planner_credits(scenario):
    after_step = scenario["offloads"][1]  # the optimizer has stepped: every state exists, so everything moves
    assert len(after_step["offloaded_states"]) == 5, after_step
    planned = after_step["planned_bytes"]
    assert abs(after_step["freed_bytes"] - planned) <= 0.01 * planned, after_step
    assert abs(after_step["allocated_after_reload"] - after_step["allocated_before"]) <= 0.01 * planned, after_step


def test_reads_are_refused_while_offloaded(scenario):
    for record in scenario["offloads"]:
        assert record["forward_refused"] and record["push_refused"], record


def test_offloaded_run_equals_its_twin(scenario):
    assert scenario["control_twins_differences"] == [], "two runs without offload differ: nondeterministic kernels"
    assert scenario["offloaded_vs_twin_differences"] == []
