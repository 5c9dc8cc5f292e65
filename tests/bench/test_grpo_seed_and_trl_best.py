"""TRL's best recipe as a contender, the seed-shaped size and what the bench reads off vLLM, without torch: the
contender's configuration, each contender's utilizations, the seed size's floor, the engine counters and the
report's table of them."""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import pytest

from bench.grpo import contenders, floor, model, report, run, sizes, vllm_counters

H200_BYTES = 150_109_880_320  # torch's total_memory of an H200
SEED = sizes.SIZES["seed"]


def test_trl_best_is_trls_trainer_with_sleep_fp32_and_ours_merge():
    assert contenders.check_contender("trl-best") == "trl-best"
    assert contenders.check_contender("trl-best@plain") == "trl-best@plain"
    for bad in ("trl-best@none", "trl-best-offload"):
        with pytest.raises(argparse.ArgumentTypeError):
            contenders.check_contender(bad)
    # The operator's file unless named; fp32 master weights under either.
    assert contenders.deepspeed_file_key("trl-best") == "product"
    assert contenders.deepspeed_file_key("trl-best@plain") == "plain"
    assert contenders.fp32_master_weights("trl-best") and not contenders.fp32_master_weights("trl-sleep@none")
    # It merges its micro-batches as ours does; TRL's other contenders keep what their users set.
    assert contenders.merges_micro_batches("trl-best@plain") and contenders.merges_micro_batches("ours-auto")
    assert not contenders.merges_micro_batches("trl-sleep@product")
    kwargs = contenders.grpo_kwargs("trl-best", Path("out"), 3, config=sizes.SIZES["large"], util=0.17)
    assert kwargs["vllm_enable_sleep_mode"] is True
    trl_sleep = contenders.grpo_kwargs("trl-sleep@product", Path("out"), 3, config=sizes.SIZES["large"], util=0.17)
    # TRL's own switch for what ours does: vLLM does not detokenize (TRL decodes the token ids itself).
    assert kwargs.pop("generation_kwargs") == {"detokenize": False} and trl_sleep.pop("generation_kwargs") is None
    assert kwargs == trl_sleep


def test_the_seed_size_is_the_seed_recipes_shape_on_one_gpu():
    kwargs = contenders.grpo_kwargs("ours-auto", Path("out"), 4, config=SEED, util=0.15)
    assert (kwargs["num_generations"], kwargs["max_completion_length"], kwargs["vllm_max_model_length"]) == (
        16,
        1024,
        512 + 1024,
    )
    assert (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"]) == (16, 4)
    assert SEED["prompts_per_step"] * SEED["num_generations"] == 16 * 4
    # A random model could still sample the end-of-sequence token: vLLM ignores it, every completion is full.
    assert kwargs["generation_kwargs"] == {"ignore_eos": True} and kwargs["temperature"] == 0.7
    assert contenders.grpo_kwargs("trl-best", Path("out"), 4, config=SEED, util=0.2)["generation_kwargs"] == {
        "ignore_eos": True,
        "detokenize": False,
    }
    # The short sizes keep TRL's defaults.
    small = contenders.grpo_kwargs("ours-auto", Path("out"), 4)
    assert small["generation_kwargs"] is None and small["temperature"] == 1.0
    assert run.parse_args(["--out", "x", "--size", "seed"]).contenders == ["ours-auto", "trl-best"]
    assert run.parse_args(["--out", "x", "--size", "seed"]).contender_timeout == 330
    assert run.parse_args(["--out", "x", "--size", "large"]).contender_timeout == 200


def seed_model_dir(tmp_path: Path) -> Path:
    """A folder with the seed size's 7B config.json (what the planner reads)."""
    shape = model.SEED_SHAPES["7b"]
    config = {
        "model_type": "qwen2",
        "vocab_size": 49152,
        "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
        "head_dim": 128,
        **shape,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_ours_takes_the_memory_plans_utilization_and_trl_the_highest_that_fits(tmp_path):
    folder = seed_model_dir(tmp_path)
    params = model.qwen2_params(model.SEED_SHAPES["7b"])
    assert round(params / 1e9, 2) == 6.88
    ladder = sizes.util_ladder(H200_BYTES, params)
    planned = contenders.ours_utilization("ours-auto", SEED, str(folder), H200_BYTES)
    assert planned is not None and planned < ladder[0]  # the KV cache of the whole batch, not all that is left
    # What the plan sized vLLM for holds every sequence of a generation at full length.
    kv_batch = 64 * (512 + 1024) * model.kv_bytes_per_token(model.SEED_SHAPES["7b"])
    weights = 2 * params
    assert planned * H200_BYTES > weights + kv_batch
    assert contenders.ours_utilization("trl-best", SEED, str(folder), H200_BYTES) is None
    args = argparse.Namespace(
        size="seed", contenders=["trl-best", "ours-auto"], util_ladder=None, num_processes=1, tp=1, cpu=False
    )
    ladders = run.contender_ladders(args, {"path": str(folder)}, {"total_bytes": H200_BYTES}, list(ladder))
    assert ladders["trl-best"] == ladder
    assert ladders["ours-auto"] == [planned, *[u for u in ladder if u < planned]]
    # --util-ladder is every contender's; at the large size every contender takes the ladder.
    args.util_ladder = "0.2,0.17"
    assert run.contender_ladders(args, {"path": str(folder)}, {"total_bytes": H200_BYTES}, [0.2, 0.17]) == {
        "trl-best": [0.2, 0.17],
        "ours-auto": [0.2, 0.17],
    }
    args.util_ladder, args.size = None, "large"
    assert run.contender_ladders(args, {"path": str(folder)}, {"total_bytes": H200_BYTES}, [0.17])["ours-auto"] == [
        0.17
    ]


def test_the_seed_floor_counts_weights_and_kv_per_token_step_and_six_flops_per_parameter_token():
    machine = {"hbm_bytes_per_s": 4e12, "bf16_flop_per_s": 8e14}
    params, kv = 7 * 10**9, 57344
    seconds = floor.floor_seconds(machine, params, SEED, kv)
    # One generation per optimizer step: 1,024 token steps, each reading the weights once and the KV cache of
    # every sequence's context so far (512 prompt tokens + the completion's).
    kv_reads = 64 * kv * sum(512 + t for t in range(1024))
    assert seconds["decode_kv_s"] == pytest.approx(kv_reads / 4e12)
    assert seconds["decode_s"] == pytest.approx((2 * params * 1024 + kv_reads) / 4e12)
    assert seconds["train_s"] == pytest.approx(6 * params * 64 * 1536 / 8e14)
    assert seconds["floor_s_per_step"] == pytest.approx(seconds["decode_s"] + seconds["train_s"])
    # The short sizes' floor stays the weights alone, whatever the model's KV bytes.
    large = floor.floor_seconds(machine, params, sizes.SIZES["large"], kv)
    assert large["decode_kv_s"] == 0 and large["decode_s"] == pytest.approx(params * 2 * 64 / 2 / 4e12)


def fake_engine(preempt: bool = True, blocks: int | None = 100) -> types.SimpleNamespace:
    """An object shaped as vLLM's LLM where the bench reads it: generate, the in-process scheduler, the cache
    config."""
    scheduler = types.SimpleNamespace(preempted=[])
    if preempt:
        scheduler._preempt_request = lambda request, timestamp: scheduler.preempted.append(request)
    cache = types.SimpleNamespace(num_gpu_blocks=blocks, block_size=16)
    engine_core = types.SimpleNamespace(engine_core=types.SimpleNamespace(scheduler=scheduler))
    llm_engine = types.SimpleNamespace(engine_core=engine_core, vllm_config=types.SimpleNamespace(cache_config=cache))

    def generate(prompts, sampling_params=None, use_tqdm=False):
        if preempt and len(prompts) > 2:  # a batch too large for the cache: one request preempted
            scheduler._preempt_request("req-0", 0.0)
        out = types.SimpleNamespace
        return [out(outputs=[out(token_ids=[1] * (4 + k))]) for k, _ in enumerate(prompts)]

    return types.SimpleNamespace(generate=generate, llm_engine=llm_engine, scheduler=scheduler)


def test_the_engine_counters_read_generates_preemptions_and_the_kv_cache(tmp_path):
    llm = fake_engine()
    calls, preemptions = vllm_counters.GenerateRecorder(llm), vllm_counters.PreemptionCounter(llm)
    llm.generate([{"prompt_token_ids": [0] * 5}] * 2)  # the warm-up's
    llm.generate([{"prompt_token_ids": [0] * 6}, {"prompt_token_ids": [0] * 7}, {"prompt_token_ids": [0] * 7}])
    assert preemptions.count == 1 and llm.scheduler.preempted == ["req-0"]  # counted, and still done
    summary = calls.summary(skip=1)
    assert summary["generate_calls"] == 2 and summary["sequences_per_generate"] == 3
    assert summary["prompt_tokens_range"] == [6, 7] and summary["completion_tokens_range"] == [4, 6]
    assert vllm_counters.kv_cache_tokens(llm) == 1600
    # Another engine: no count, no capacity, rather than a 0 that was never read.
    other = fake_engine(preempt=False, blocks=None)
    assert vllm_counters.PreemptionCounter(other).count is None and vllm_counters.kv_cache_tokens(other) is None
    (tmp_path / "stderr.log").write_text(
        "INFO ... GPU KV cache size: 1,234 tokens\nINFO GPU KV cache size: 98,304 tokens\n"
    )
    assert vllm_counters.logged_kv_cache_tokens(tmp_path) == 98304
    assert vllm_counters.logged_kv_cache_tokens(tmp_path / "none") is None


def test_the_report_shows_each_contenders_engine_and_the_floor_split(tmp_path):
    measured = {
        "median_s_per_step": 20.0,
        "warmup_steps": 1,
        "step_times": [30.0, 20.0, 20.0, 20.0],
        "breakdown_total_seconds": {},
        "params": 7 * 10**9,
        "micro_batch": [32, 2],
        "generate_s_median": 8.25,
        "sequences_per_generate": 64,
        "prompt_tokens_range": [512, 512],
        "completion_tokens_range": [1024, 1024],
        "kv_cache_tokens": 240_000,
        "vllm_preemptions": 0,
    }
    results = [{"contender": "ours-auto", **measured}, {"contender": "trl-best", **measured, "vllm_preemptions": None}]
    machine = {"hbm_bytes_per_s": 4e12, "bf16_flop_per_s": 8e14, "device": "H200"}
    lines = report.write_report(tmp_path, machine, results, 1, 3, "seed", {"path": "m", "kv_bytes_per_token": 57344})
    text = "\n".join(lines)
    assert "| ours-auto | 32 x 2 | 8.250 | 64 | 512 | 1024 | 240,000 (98,304) | 0 |" in text
    assert "| trl-best | 32 x 2 | 8.250 | 64 | 512 | 1024 | 240,000 (98,304) | ? |" in text
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["floor"]["decode_kv_s"] > 0 and "KV cache reads" in text and bench["size"] == "seed"
