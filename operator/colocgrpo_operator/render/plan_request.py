"""ColocGRPOJob -> PlanRequest: the memory planner's input from a job, and the job's plan.

The operator's adapter (the `PlanWarning` condition, `colocgrpo plan`); the trainer's builds the same request from
its config (`colocgrpo_training.planner.from_trainer_config`). The vLLM, resources and DeepSpeed sections are the
ones the trainer config gets (`render_trainer_config`), so both sides plan one job alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import GPU_MEMORY_ANNOTATION
from colocgrpo_operator.api.validation import pydantic_problems
from colocgrpo_operator.render.trainer_config import deepspeed_settings, merge_pin, resource_settings, vllm_settings
from colocgrpo_training.config import VLLMSettings
from colocgrpo_training.planner import MemoryPlan, PlanInputError, PlanRequest, plan


def plan_request(job: ColocGRPOJob, *, gpu_memory_gib: float | None = None) -> PlanRequest:
    """The job as the planner reads it.

    Args:
        job: the job (typed; only single-field validation is needed: the planner warns about, and credits nothing
            to, what the cross-field rules refuse).
        gpu_memory_gib: memory per GPU in GiB; wins over `spec.resources.gpuMemoryGiB`, which wins over the
            annotation `colocgrpo.io/gpu-memory-gib`. None of them: the planner's default (an H200).

    Raises:
        PlanInputError: the annotation is not a number of GiB.
    """
    spec = job.spec
    gib = gpu_memory_gib if gpu_memory_gib is not None else spec.resources.gpu_memory_gib
    if gib is None:
        gib = _annotated_gpu_memory(job.metadata.annotations)
    resources = resource_settings(job)
    vllm = vllm_settings(job)
    if "gpu_memory_utilization" not in spec.vllm.model_fields_set:  # left out: the plan says it took the default
        vllm = VLLMSettings.model_validate(vllm.model_dump(exclude={"gpu_memory_utilization"}))
    return PlanRequest(
        model=spec.model.name,
        dtype=spec.model.dtype,
        parameter_count=spec.model.parameter_count,
        resources=resources.model_copy(update={"gpu_memory_gib": gib}),
        deepspeed=deepspeed_settings(job),
        vllm=vllm,
        max_prompt_tokens=spec.dataset.max_prompt_tokens,
        trainer_args=dict(spec.trainer_args),
        micro_batch_merge=merge_pin(job),
    )


def _annotated_gpu_memory(annotations: Mapping[str, str]) -> float | None:
    text = annotations.get(GPU_MEMORY_ANNOTATION)
    if not text:
        return None
    field = f"metadata.annotations[{GPU_MEMORY_ANNOTATION}]"
    try:
        value = float(text)
    except ValueError:
        raise PlanInputError(field, f"must be a number of GiB, got {text!r}") from None
    if not value > 0:
        raise PlanInputError(field, f"must be positive, got {text!r}")
    return value


def plan_job(
    job: ColocGRPOJob | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    base_dir: str | Path | None = None,
) -> MemoryPlan:
    """Plan a whole job: the entry point of the operator (the `PlanWarning` condition) and `colocgrpo plan`.

    Args:
        job (`ColocGRPOJob` or `dict`):
            The job, typed or as a dict (YAML, the API server; its status is not read).
        gpu_memory_gib (`float`, *optional*):
            Memory per GPU in GiB; wins over the spec and the annotation (`plan_request`).
        base_dir (`str` or `Path`, *optional*):
            Where a relative local model directory is looked up (`colocgrpo plan` passes the job file's folder).

    Returns:
        [`MemoryPlan`]: as `colocgrpo_training.planner.plan` returns it.

    Raises:
        PlanInputError: the job is not a ColocGRPOJob (the first field at fault), or cannot be planned (an unknown
            model without `spec.model.parameterCount`, a GPU-memory annotation that is not a number); `.field`
            names the field to fix.
    """
    if isinstance(job, Mapping):
        job = _typed(job)
    return plan(plan_request(job, gpu_memory_gib=gpu_memory_gib), base_dir=base_dir)


def _typed(obj: Mapping[str, Any]) -> ColocGRPOJob:
    if obj.get("spec") is None:
        raise PlanInputError("spec", "is required")
    try:
        return ColocGRPOJob.model_validate({key: value for key, value in obj.items() if key != "status"})
    except ValidationError as error:
        field, message = pydantic_problems(error)[0]
        raise PlanInputError(field, message) from None
