"""TrainerConfig → TRL 1.16 `GRPOConfig` keyword arguments.

`grpo_kwargs` is pure (no torch, no TRL import) so the mapping can be tested and shown
without the trainer's dependencies. The typed fields of the config own some GRPOConfig
keys; the `grpo` passthrough may not set those (the operator already rejects them, the
trainer checks again because a hand-written config skips the operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from colocgrpo_training.config import SleepPolicy, TrainerConfig, VLLMSettings
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.micro_batching import agree_merge, merge_micro_batches
from colocgrpo_training.planner.merge import MicroBatchMerge
from colocgrpo_training.planner.request import from_trainer_config

if TYPE_CHECKING:
    from trl import GRPOConfig

# GRPOConfig keys derived from typed fields, and the field that owns each.
OWNED_KEYS: dict[str, str] = {
    "output_dir": "checkpoint.dir",
    "save_strategy": "checkpoint.saveSteps",
    "save_steps": "checkpoint.saveSteps",
    "save_total_limit": "checkpoint.saveTotalLimit",
    "resume_from_checkpoint": "checkpoint.resume",
    "use_vllm": "vllm.enabled",
    "vllm_mode": "vllm (always colocate)",
    "vllm_tensor_parallel_size": "vllm.tensorParallelSize",
    "vllm_gpu_memory_utilization": "vllm.gpuMemoryUtilization",
    "vllm_enable_sleep_mode": "vllm.sleepPolicy",
    "vllm_max_model_length": "vllm.maxModelLen",
    "bf16": "model.dtype",
    "fp16": "model.dtype",
    "reward_weights": "rewards[].weight",
}

# Defaults we prefer over TRL's, still overridable through `grpo`.
DEFAULTS: dict[str, Any] = {
    # Progress reports read TRL's logged metrics, so log every step.
    "logging_steps": 1,
    # Pods have no wandb/tensorboard credentials unless the user asks for them.
    "report_to": "none",
}


# TRL's name of each vLLM setting in GRPOConfig, and in the keyword arguments GRPOTrainer builds its
# VLLMGeneration (our ColocatedVLLM) with: GRPOTrainer passes the one as the other.
ENGINE_ARGUMENTS: dict[str, str] = {
    "vllm_mode": "mode",
    "vllm_tensor_parallel_size": "tensor_parallel_size",
    "vllm_gpu_memory_utilization": "gpu_memory_utilization",
    "vllm_max_model_length": "max_model_length",
    "vllm_enable_sleep_mode": "enable_sleep_mode",
}


def vllm_args(vllm: VLLMSettings) -> dict[str, Any]:
    """The GRPOConfig keys `vllm` sets: the one writer of each vLLM setting on its way from the trainer config to
    `LLM(...)`. `ColocGRPOTrainer` and `ColocatedVLLM` check what reaches them against it (`vllm_mismatches`) and
    refuse a difference; they overwrite nothing.

    `vllm_enable_sleep_mode` says whether vLLM is built with its sleep mode, which every policy but `off` needs;
    when it sleeps, and how deep, is the policy's (`SleepController`), never TRL's: `ColocatedVLLM` overrides every
    TRL method that would sleep or wake on that flag."""
    if not vllm.enabled:
        return {"use_vllm": False}
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": vllm.tensor_parallel_size,
        "vllm_gpu_memory_utilization": vllm.gpu_memory_utilization,
        "vllm_max_model_length": vllm.max_model_len,
        "vllm_enable_sleep_mode": vllm.sleep_policy is not SleepPolicy.OFF,
    }


def vllm_mismatches(vllm: VLLMSettings, given: Mapping[str, Any], *, engine: bool = False) -> list[str]:
    """Where `given` holds another value than `vllm_args(vllm)` writes, one line each; a key it lacks is no
    difference.

    Args:
        vllm: the trainer config's vLLM settings.
        given: GRPOConfig's fields, or with `engine` the keyword arguments TRL builds its engine with.
        engine: `given` uses the engine's names (`ENGINE_ARGUMENTS`); `use_vllm` is not among them.
    """
    problems = []
    for key, value in vllm_args(vllm).items():
        name = ENGINE_ARGUMENTS.get(key) if engine else key
        if name is not None and name in given and given[name] != value:
            problems.append(f"{name} is {given[name]!r} where {OWNED_KEYS[key]} sets {value!r}")
    return problems


def grpo_kwargs(config: TrainerConfig, reward_weights: list[float] | None = None) -> dict[str, Any]:
    passthrough = dict(config.grpo)
    clashes = sorted(key for key in passthrough if key in OWNED_KEYS)
    if clashes:
        raise InvalidConfigError(
            "; ".join(f"grpo.{key} is set by {OWNED_KEYS[key]}, not by the grpo passthrough" for key in clashes)
        )

    kwargs: dict[str, Any] = dict(DEFAULTS)
    kwargs.update(passthrough)

    checkpoint = config.checkpoint
    kwargs["output_dir"] = checkpoint.dir
    if checkpoint.save_steps is not None:
        kwargs["save_strategy"] = "steps"
        kwargs["save_steps"] = checkpoint.save_steps
    else:
        kwargs["save_strategy"] = "no"  # a SIGTERM still saves (SaveOnTermination)
    kwargs["save_total_limit"] = checkpoint.save_total_limit

    kwargs.update(vllm_args(config.vllm))

    dtype = config.model.dtype
    kwargs["bf16"] = dtype == "bfloat16"
    kwargs["fp16"] = dtype == "float16"

    # The model is loaded by TRL from its name (after GRPOConfig exists, so that DeepSpeed
    # ZeRO-3 can shard it while loading); these are its from_pretrained arguments.
    model_init = dict(passthrough.get("model_init_kwargs") or {})
    model_init["dtype"] = dtype
    if config.model.revision is not None:
        model_init["revision"] = config.model.revision
    if config.model.attn_implementation is not None:
        model_init["attn_implementation"] = config.model.attn_implementation
    kwargs["model_init_kwargs"] = model_init

    if reward_weights is not None:
        kwargs["reward_weights"] = list(reward_weights)
    return kwargs


def build_grpo_config(
    config: TrainerConfig, reward_weights: list[float] | None = None
) -> tuple[GRPOConfig, MicroBatchMerge]:
    """The GRPOConfig, and the merge decision it was built with; TRL's own validation errors become InvalidConfig
    naming `grpo`.

    The training micro-batch is merged where the step stays the same and the memory plan allows
    (micro_batching.py: fewer, larger micro-batches; `training.micro_batch_merge: off` keeps them as set), and
    gradient checkpointing left unset is turned off, or kept on the first layers only, where the merged
    micro-batch's activations fit with less of it (the trainer applies the latter: `MicroBatchMerge.trainer_options`).
    A collective in a job of several processes: building the first GRPOConfig starts the process group
    (TrainingArguments sets its device up), over which the ranks agree on the merge (`agree_merge`)."""
    kwargs = grpo_kwargs(config, reward_weights)
    local: MicroBatchMerge | None = None
    problem = None
    try:
        _, local = merge_micro_batches(from_trainer_config(config, kwargs), revision=config.model.revision)
    except InvalidConfigError as err:
        problem = str(err)  # every rank stops with it, after the agreement below
    grpo_config = _grpo_config(kwargs)
    merge = agree_merge(local, problem)
    return (_grpo_config(merge.rewrite(kwargs)) if merge.changes else grpo_config), merge


def _grpo_config(kwargs: dict[str, Any]) -> GRPOConfig:
    import dataclasses

    from trl import GRPOConfig

    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise InvalidConfigError(f"grpo: unknown TRL 1.16 GRPOConfig field(s) {unknown}")
    try:
        return GRPOConfig(**kwargs)
    except (ValueError, TypeError) as err:
        raise InvalidConfigError(f"grpo: TRL rejected the GRPO settings: {err}") from err
