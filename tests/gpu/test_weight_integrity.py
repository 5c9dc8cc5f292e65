"""Weight integrity of colocated vLLM under every sleep policy, on a real GPU.

One `ColocatedVLLM` (one sleep-enabled engine per process) on SmolLM2-135M-Instruct is
driven with the CPU property test's schedule generator. At every generate, vLLM's greedy
completion must be a greedy completion of the trainer model at its current weights: the
trainer model re-scores vLLM's tokens (teacher forcing) and each chosen token must be its
arg-max up to bf16 kernel noise (`FRESH_MARGIN` logits). Staleness must be visible: the
previous generate's completions, re-scored under the new weights after each step, must
miss by more than `STALE_MARGIN` (checked over all steps: see `STALE_FRACTION`); and the
naive level-2 sequence (wake without a push) fails the check. The trainer's weight
versions are independent perturbations around the checkpoint (integrity_checks.py says
why not cumulative training).

Environment:
  COLOCGRPO_TEST_MODEL              model folder (default /tmp/models/smollm2-135m-instruct)
  COLOCGRPO_RESULTS_DIR             write weight_integrity.json there
  COLOCGRPO_INTEGRITY_POLICIES      default off,level1,level2,auto
  COLOCGRPO_INTEGRITY_SEEDS         schedule seeds per policy, default 11,12,13
  COLOCGRPO_INTEGRITY_MAX_STEPS     optimizer steps per schedule, default 5
  COLOCGRPO_INTEGRITY_DEVICE/_DTYPE  cuda/bfloat16; cpu/float32 for CPU dry runs with a vLLM stand-in
  COLOCGRPO_INTEGRITY_ZERO3=1       the trainer model partitioned by DeepSpeed ZeRO-3 as an 8-GPU job's
                                    deepspeed.json renders it (large parameters released after use);
                                    with COLOCGRPO_PUSH_FORCE_GATHER=1 every push goes through the
                                    bucket's GatheredParameters, the path of multi-GPU jobs
  COLOCGRPO_INTEGRITY_TP            vLLM tensor-parallel size (default 1); run the suite in one process per
                                    GPU, `python -m torch.distributed.run --nproc-per-node N -m pytest ...`:
                                    every rank checks its own share of its TP group's generates
  COLOCGRPO_INTEGRITY_SIGMA/_STALE_MARGIN  the weight versions' perturbation (default 0.1 × each tensor's std)
                                    and the stale-margin bound (default 3.0 logits): SmolLM2's. CPU dry runs on
                                    the tiny random model, whose greedy output barely moves and whose logits are
                                    small, pass 4 and 0.1
  COLOCGRPO_REQUIRE_GPU=1           fail instead of skipping when CUDA or vLLM is missing
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from support.gpu_requirements import unavailable

pytestmark = pytest.mark.gpu


try:
    import torch
except ImportError:
    unavailable("torch is not installed")
# CPU dry runs of this suite (a vLLM stand-in on PYTHONPATH, docs/gpu-proofs.md) set cpu/float32.
DEVICE = os.environ.get("COLOCGRPO_INTEGRITY_DEVICE", "cuda")
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))  # set by torch.distributed.run with several processes
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
DTYPE = getattr(torch, os.environ.get("COLOCGRPO_INTEGRITY_DTYPE", "bfloat16"))
if DEVICE == "cuda" and not torch.cuda.is_available():
    unavailable("needs a CUDA GPU")
if DEVICE == "cuda" and torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
    unavailable(f"needs a GPU per process ({os.environ.get('LOCAL_WORLD_SIZE')}), has {torch.cuda.device_count()}")
try:
    import vllm  # noqa: F401
except ImportError as err:
    unavailable(f"vLLM does not import ({err})")

from support.integrity_checks import WeightVersions, chat_prompt_ids, max_margin  # noqa: E402 - after the skips

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")
ZERO3 = os.environ.get("COLOCGRPO_INTEGRITY_ZERO3") == "1"
POLICIES = [p for p in os.environ.get("COLOCGRPO_INTEGRITY_POLICIES", "off,level1,level2,auto").split(",") if p]
SEEDS = [int(s) for s in os.environ.get("COLOCGRPO_INTEGRITY_SEEDS", "11,12,13").split(",") if s]
MAX_STEPS = int(os.environ.get("COLOCGRPO_INTEGRITY_MAX_STEPS", "5"))
TP = int(os.environ.get("COLOCGRPO_INTEGRITY_TP", "1"))
FRESH_MARGIN = 1.5  # logits: HF vs vLLM bf16 kernel differences stay below this
# A stale completion misses the new arg-max by more than this somewhere.
STALE_MARGIN = float(os.environ.get("COLOCGRPO_INTEGRITY_STALE_MARGIN", "3.0"))
SIGMA = float(os.environ.get("COLOCGRPO_INTEGRITY_SIGMA", "0.1"))
STALE_FRACTION = 0.8  # of the steps must expose staleness (measured: all, with 5.0+ logits)
NEW_TOKENS = 12
PROMPTS = [
    "What is 2 + 3?",
    "Name a colour of the sky.",
    "Write one word that rhymes with cat.",
    "What is the capital of France?",
    "Count from one to five.",
    "Give me a fruit.",
]
RESULTS: dict = {
    "policies": {},
    "model": MODEL,
    "processes": WORLD_SIZE,
    "tensor_parallel_size": TP,
    "fresh_margin_bound": FRESH_MARGIN,
    "stale_margin_bound": STALE_MARGIN,
    "sigma": SIGMA,
}


def _write_results() -> None:
    out = os.environ.get("COLOCGRPO_RESULTS_DIR")
    if out and int(os.environ.get("RANK", "0")) == 0:  # every rank asserts; rank 0 reports
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "weight_integrity.json").write_text(json.dumps(RESULTS, indent=2, default=str))


@pytest.fixture(scope="module")
def rig():
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocatedVLLM

    if not Path(MODEL).exists():
        pytest.fail(f"test model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)")
    if ZERO3 and WORLD_SIZE > 1:
        pytest.fail("COLOCGRPO_INTEGRITY_ZERO3 partitions over one process: run it without torch.distributed.run")
    torch.manual_seed(0)
    device = torch.device(DEVICE, LOCAL_RANK) if DEVICE == "cuda" else torch.device(DEVICE)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tok = AutoTokenizer.from_pretrained(MODEL)
    # Every rank holds the whole trainer model (and, by WeightVersions' seeds, the same versions).
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=DTYPE).to(device).eval()
    gather = None
    if ZERO3:
        model, gather = zero3_partitioned(model)
    # After: completing the DeepSpeed file resets accelerate's state. Several CPU processes: gloo.
    accelerator = Accelerator(cpu=device.type == "cpu" and WORLD_SIZE > 1)
    RESULTS.update(zero3=ZERO3, push_force_gather=os.environ.get("COLOCGRPO_PUSH_FORCE_GATHER") == "1")
    versions = WeightVersions(model, sigma=SIGMA, gather=gather)
    start = time.perf_counter()
    engine = ColocatedVLLM(
        model,
        accelerator,
        tok,
        # Built with sleep mode; each test switches the policy on the same engine.
        settings=VLLMSettings(
            tensor_parallel_size=TP, sleep_policy="level2", gpu_memory_utilization=0.3, max_model_len=512
        ),
        seed=0,
        bucket_bytes=64 * 1024 * 1024,
        temperature=0.0,
        max_completion_length=NEW_TOKENS,
        logprobs=0,
        generation_kwargs={"ignore_eos": True},
    )
    RESULTS["engine_build_seconds"] = time.perf_counter() - start
    engine.weight_version = lambda: versions.version
    if ZERO3:
        # TRL's backend reads the ZeRO stage from accelerate's DeepSpeed plugin, which this rig (a
        # bare DeepSpeed engine, no launcher) has not: say it, so the push gathers.
        engine._dist.zero_stage = 3
    prompt_ids = chat_prompt_ids(tok, PROMPTS)
    yield {"engine": engine, "model": model, "tok": tok, "prompts": prompt_ids, "versions": versions}
    _write_results()


def zero3_partitioned(model):
    """The model's parameters partitioned by a one-process DeepSpeed ZeRO-3 engine (no optimizer:
    the suite moves weights itself) under an 8-GPU job's rendered zero_optimization section."""
    import deepspeed

    from bench.machine_job import completed_deepspeed_config
    from support.zero3_states import single_process_env

    if not torch.distributed.is_initialized():
        os.environ.update(single_process_env())
        deepspeed.init_distributed(dist_backend="nccl" if DEVICE == "cuda" else "gloo")
    # In the suite's dtype (float32 in CPU dry runs): DeepSpeed would cast the model to bf16 otherwise.
    config = completed_deepspeed_config(model, bf16=DTYPE is torch.bfloat16)
    config.pop("optimizer", None)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    params = list(engine.module.parameters())
    released = sum(p.ds_tensor.numel() > 0 and p.data.numel() == 0 for p in params)
    RESULTS["zero3_released_parameters"] = f"{released}/{len(params)}"
    assert released > 0, "no parameter was released: the ZeRO-3 layout is not a multi-GPU one"

    def gather(params, modify):
        return deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None)

    return engine.module.eval(), gather


def drive(rig, policy: str, schedule_seed: int) -> dict:
    from colocgrpo_training.generation.schedules import (
        Generate,
        NextGenerate,
        OptimizerStep,
        ScheduleParams,
        build_schedule,
        random_params,
    )

    engine, model, prompts, versions = rig["engine"], rig["model"], rig["prompts"], rig["versions"]
    rng = random.Random(schedule_seed)
    params = random_params(rng, max_steps=MAX_STEPS)
    # One process: no restarts here (the CPU property test covers them).
    params = ScheduleParams(**{**params.__dict__, "restart_after_step": None, "save_every": 0})
    schedule = build_schedule(params)
    engine.set_policy(policy)
    before = dict(engine.controller.counters.as_dict())
    fresh_margins, stale_margins = [], []
    previous = None
    stepped_since_generate = False
    version_changes = 0  # generates whose weights differ from the previous generate's
    record = {"schedule": schedule.describe(), "fresh_margins": fresh_margins, "stale_margins": stale_margins}
    RESULTS["policies"].setdefault(policy, {"runs": []})["runs"].append(record)
    for event in schedule.events:
        if isinstance(event, OptimizerStep):
            versions.step()
            stepped_since_generate = True
        elif isinstance(event, Generate):
            engine.next_generate = NextGenerate(event.push_due_before_next, event.last_in_process)
            _, completions, _, _ = engine.generate(prompts, None, 1)
            margin = max_margin(model, prompts, completions)
            fresh_margins.append(margin)
            assert margin <= FRESH_MARGIN, (
                f"{policy}: vLLM output is not the trainer's greedy output at version {versions.version} "
                f"(margin {margin:.2f} > {FRESH_MARGIN})"
            )
            version_changes += stepped_since_generate
            if previous is not None and stepped_since_generate:
                stale_margins.append(max_margin(model, prompts, previous))
            previous, stepped_since_generate = completions, False
    after = engine.controller.counters.as_dict()
    record.update({k: after[k] - before[k] for k in after})  # the controller's counters
    record.update(schedule_generates=len(schedule.generates), version_changes=version_changes)
    assert record["generates"] == record["schedule_generates"], record
    return record


@pytest.mark.parametrize("policy", POLICIES)
def test_every_generate_uses_current_weights(rig, policy):
    start = time.perf_counter()
    try:
        runs = [drive(rig, policy, seed) for seed in SEEDS]
    finally:
        RESULTS["policies"].setdefault(policy, {"runs": []})["seconds"] = time.perf_counter() - start
        _write_results()
    for r in runs:
        if policy == "level2":
            assert r["pushes"] == r["generates"], r
        if policy in ("off", "level1"):
            assert r["pushes"] == r["version_changes"], r  # exactly when the weights changed
        if policy == "auto":
            assert r["version_changes"] <= r["pushes"] <= r["generates"], r
    stale = [m for r in runs for m in r["stale_margins"]]
    assert stale, f"{policy}: no generate followed a weight change; the schedules exercised nothing"
    exposed = sum(m > STALE_MARGIN for m in stale) / len(stale)
    assert exposed >= STALE_FRACTION, (
        f"{policy}: steps too small to expose stale weights ({exposed:.0%} of {len(stale)} above {STALE_MARGIN})"
    )


def test_naive_level2_wake_without_push_fails(rig):
    """The seed's bug, reproduced on the real engine: the check above catches it."""
    from vllm import SamplingParams

    engine, model, prompts = rig["engine"], rig["model"], rig["prompts"]
    engine.set_policy("off")  # awake, holding the current weights
    _, good, _, _ = engine.generate(prompts, None, 1)
    assert max_margin(model, prompts, good) <= FRESH_MARGIN
    engine.llm.sleep(level=2)
    engine.llm.wake_up()  # all tags, no push: the naive sequence
    outputs = engine.llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    naive = [list(o.outputs[0].token_ids) for o in outputs]
    margin = max_margin(model, prompts, naive)
    RESULTS["naive_level2_margin"] = margin
    _write_results()
    assert margin > STALE_MARGIN, f"naive level-2 output passed the check ({margin:.2f})"
    # Restore the engine for anything after: a full push of the current weights.
    engine.controller.invalidate("naive level-2 experiment")
    engine.controller.prepare(engine, engine.weight_version())
    _, again, _, _ = engine.generate(prompts, None, 1)
    assert max_margin(model, prompts, again) <= FRESH_MARGIN
