"""micro_batching.py: the facts a training process reads for the merge, and the GRPOConfig a real job gets."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from pydantic import ValidationError

from colocgrpo_training import micro_batching
from colocgrpo_training.config import (
    ResourceSettings,
    TrainerConfig,
    TrainingSettings,
    VLLMSettings,
)
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.micro_batching import agree_merge, merge_micro_batches, model_config
from colocgrpo_training.planner import PlanRequest
from support import bench_7b

pytestmark = pytest.mark.trainer

BENCH_VLLM = VLLMSettings(gpu_memory_utilization=bench_7b.BENCH_UTILIZATION, max_model_len=512)


def test_merge_pin_values():
    assert TrainingSettings().micro_batch_merge == "auto"
    for value in ("auto", "off", 2):
        assert TrainingSettings(micro_batch_merge=value).micro_batch_merge == value
    for bad in ("0", "-2", "yes", "1.5"):
        with pytest.raises(ValidationError, match="micro_batch_merge"):
            TrainingSettings(micro_batch_merge=bad)


def one_gpu_job() -> TrainerConfig:
    """The trainer config the operator renders for a one-GPU job: its shape and its deepspeed.json's ZeRO stage."""
    from bench.machine_job import machine_job
    from colocgrpo_operator.render import render_trainer_config

    return render_trainer_config(machine_job(gpus=1))


def test_the_config_carries_what_deepspeed_json_says():
    from bench.machine_job import machine_job
    from colocgrpo_operator.render import deepspeed_config, render_trainer_config

    for job in (machine_job(gpus=1), machine_job(gpus=4, offload_trainer_state=True)):
        zero = deepspeed_config(job)["zero_optimization"]
        config = render_trainer_config(job)
        assert config.deepspeed.zero_stage == zero["stage"] == 3
        assert config.deepspeed.offload_optimizer == zero["offload_optimizer"]["device"] == "none"
        assert config.deepspeed.offload_params == zero["offload_param"]["device"] == "none"
        assert config.resources.world_size == job.world_size
    assert one_gpu_job().resources.world_size == 1


def test_model_config_from_a_local_folder(tmp_path):
    folder = bench_7b.model_dir(tmp_path)
    assert model_config(str(folder)) == (str(folder), bench_7b.CONFIG)
    # neither a folder nor a Hub id: the planner's built-in table gets the name
    assert model_config(str(tmp_path / "absent" / "model")) == (str(tmp_path / "absent" / "model"), None)


def bench_request(tmp_path, grpo: dict, **fields) -> PlanRequest:
    """The 7.18B bench shape as a one-GPU job (`fields` replace the request's)."""
    job = one_gpu_job()
    request = PlanRequest(
        model=str(bench_7b.model_dir(tmp_path)),
        dtype="bfloat16",
        resources=job.resources,
        deepspeed=job.deepspeed,
        vllm=BENCH_VLLM,
        max_prompt_tokens=40,
        trainer_args=grpo,
    )
    return dataclasses.replace(request, **fields)


def test_a_one_gpu_job_of_the_7b_bench_shape_merges_four(tmp_path, caplog):
    # Everything a pod's process reads, but the GPU: its memory is the H200's torch total_memory.
    h200 = one_gpu_job().resources.model_copy(update={"gpu_memory_gib": 139.8})
    grpo = {**bench_7b.trainer_args(), "learning_rate": 1e-6}
    with caplog.at_level(logging.INFO, logger="colocgrpo.micro_batches"):
        merged, merge = merge_micro_batches(bench_request(tmp_path, grpo, resources=h200))
        assert agree_merge(merge) is merge  # one process: its own decision, logged
    assert merge.factor == 4
    assert merged == {
        **grpo,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,
    }
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("training micro-batches merged 4 into 1: 1 x 64 rows per optimizer step instead of 4 x 16")
    assert "within 132.8 GiB (95 % of 139.8)" in line
    # two processes on the node: each GPU holds half the ZeRO-3 states (P/N), so the peak is far lower
    two = h200.model_copy(update={"gpus_per_node": 2})
    _, merge = merge_micro_batches(bench_request(tmp_path, grpo, resources=two))
    assert merge.factor == 4 and merge.peaks_gib[0][1] < 70


def test_without_a_gpu_or_with_merging_off_nothing_changes(tmp_path, monkeypatch):
    grpo = bench_7b.trainer_args()
    monkeypatch.setattr(micro_batching, "device_memory_gib", lambda: None)
    kept, merge = merge_micro_batches(bench_request(tmp_path, grpo))
    assert kept == grpo and merge.factor == 1 and merge.reason == "no memory plan: no CUDA device"
    h200 = ResourceSettings(gpu_memory_gib=139.8)
    kept, merge = merge_micro_batches(bench_request(tmp_path, grpo, micro_batch_merge="off", resources=h200))
    assert kept == grpo and merge.reason == "merging is off (spec.training.microBatchMerge: off)"
    # an unplannable process (a model neither on disk nor in the planner's table) keeps the micro-batch and says why
    unknown = bench_request(tmp_path, grpo, model=str(tmp_path / "absent"), resources=h200)
    kept, merge = merge_micro_batches(unknown)
    assert kept == grpo and merge.reason.startswith("no memory plan: spec.model.name: unknown model")
    pinned, merge = merge_micro_batches(bench_request(tmp_path, grpo, micro_batch_merge=2, resources=h200))
    assert merge.factor == 2 and pinned["per_device_train_batch_size"] == 32
    with pytest.raises(InvalidConfigError, match="would change the step: loss_type bnpo"):
        merge_micro_batches(bench_request(tmp_path, {**grpo, "loss_type": "bnpo"}, micro_batch_merge=2, resources=h200))


def test_build_grpo_config_merges_for_a_real_job(tmp_path, tiny_model_dir):
    from colocgrpo_training.grpo_args import build_grpo_config

    config = TrainerConfig.model_validate(
        {
            "job": {"name": "j", "namespace": "n"},
            "model": {"name_or_path": str(tiny_model_dir), "dtype": "float32"},
            "dataset": {"name_or_path": "d"},
            "rewards": [{"function": "format"}],
            "vllm": {"enabled": False},
            "checkpoint": {"dir": str(tmp_path)},
            "grpo": {
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "num_generations": 4,
                "use_cpu": True,
            },
        }
    )
    args, _ = build_grpo_config(config)  # a CPU job: no memory plan, nothing merged
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation) == (4, 2, 2)
    args, _ = build_grpo_config(config.model_copy(update={"training": TrainingSettings(micro_batch_merge=2)}))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation) == (8, 1, 1)
    assert args.generation_batch_size == 8


def test_ranks_agree_on_the_most_checkpointed_layers_any_rank_planned(monkeypatch, caplog):
    # What each rank planned, as agree_merge's gather returns it to every rank: the first rank's decision of the
    # most checkpointed layers wins (as configured counts as every layer), the same on every rank.
    from colocgrpo_training.planner.merge import MicroBatchMerge, Recompute

    def decision(recompute: Recompute | None) -> MicroBatchMerge:
        return MicroBatchMerge(2, 16, 4, 8, "fits", ((2, 100.0),), 132.8, recompute)

    off, first18, first20 = Recompute(0, 32, 120.0), Recompute(18, 32, 132.2), Recompute(20, 32, 130.0)

    def agreed(mine: Recompute | None, everyone: list[Recompute | None]) -> MicroBatchMerge:
        plans = [(2, "fits", plan) for plan in everyone]
        monkeypatch.setattr(micro_batching, "gather", lambda local: plans)
        return agree_merge(decision(mine))

    with caplog.at_level(logging.WARNING, logger="colocgrpo.micro_batches"):
        assert agreed(first18, [first18, first18, first18, first18]).recompute == first18
        assert not caplog.records  # every rank planned the same: nothing to warn about
        assert agreed(off, [off, first18, first20, off]).recompute == first20
        assert agreed(first18, [off, first18, first20, off]).recompute == first20
        assert agreed(first20, [off, first18, first20, off]).recompute == first20
        together = agreed(off, [off, first18, None, first20])
    assert together.recompute is None and together.trainer_options() == {} and together.changes  # merged 2
    assert "gradient_checkpointing" not in together.rewrite({"per_device_train_batch_size": 16})
    assert caplog.records[-1].getMessage() == (
        "this rank planned gradient checkpointing on no layer; every rank runs it on every layer, as configured, the "
        "most of any rank (per rank: ['no layer', '18 of 32 layers', 'every layer, as configured', '20 of 32 layers'])"
    )
    # the agreed plan runs as the trainer's option where it is some layers, as GRPOConfig's where it is none
    assert agreed(off, [off, first20]).trainer_options() == {"checkpointed_layers": 20}
    assert agreed(off, [off, off]).rewrite({})["gradient_checkpointing"] is False
