"""The planner's one input: everything it reads about a job, typed.

One adapter per side builds it, each from its own typed object: the operator's from a `ColocGRPOJob`
(`colocgrpo_operator.render.plan_request`: the `PlanWarning` condition and `colocgrpo plan`), the trainer's from
its `TrainerConfig` (`from_trainer_config`: the micro-batch merge). The sections are the trainer config's own
models, so a setting has one spelling from the config to the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from colocgrpo_training.config import (
    DeepSpeedSettings,
    Dtype,
    MergePin,
    ResourceSettings,
    TrainerConfig,
    VLLMSettings,
)


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """A job as the planner reads it.

    Attributes:
        model: a local folder with a `config.json`, or a name the built-in table knows (`shapes.py`).
        dtype: the weights' dtype (`spec.model.dtype`).
        parameter_count: `spec.model.parameterCount`, for a model whose shape is not at hand.
        resources: the gang's shape and the memory per GPU (None: `DEFAULT_GPU_MEMORY_GIB`).
        deepspeed: the ZeRO stage and offloads.
        vllm: the colocated engine's settings.
        max_prompt_tokens: `spec.dataset.maxPromptTokens`.
        trainer_args: GRPOConfig keyword arguments in TRL's names; unset keys take TRL 1.16's defaults.
        micro_batch_merge: the merge pin (`spec.training.microBatchMerge`).
    """

    model: str
    dtype: Dtype = "bfloat16"
    parameter_count: int | None = None
    resources: ResourceSettings = dataclasses.field(default_factory=ResourceSettings)
    deepspeed: DeepSpeedSettings = dataclasses.field(default_factory=DeepSpeedSettings)
    vllm: VLLMSettings = dataclasses.field(default_factory=VLLMSettings)
    max_prompt_tokens: int | None = None
    trainer_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    micro_batch_merge: MergePin = "auto"

    @property
    def is_cpu_job(self) -> bool:
        """gpusPerNode 0: no vLLM, no DeepSpeed, nothing to plan."""
        return self.resources.gpus_per_node == 0


def from_trainer_config(config: TrainerConfig, trainer_args: Mapping[str, Any] | None = None) -> PlanRequest:
    """The trainer's adapter: the plan request of the job this config runs.

    Args:
        config: the trainer config.
        trainer_args: the GRPOConfig keyword arguments the trainer builds (`grpo_args.grpo_kwargs`); default the
            config's `grpo` passthrough.
    """
    return PlanRequest(
        model=config.model.name_or_path,
        dtype=config.model.dtype,
        resources=config.resources,
        deepspeed=config.deepspeed,
        vllm=config.vllm,
        max_prompt_tokens=config.dataset.max_prompt_tokens,
        trainer_args=dict(config.grpo if trainer_args is None else trainer_args),
        micro_batch_merge=config.training.micro_batch_merge,
    )
