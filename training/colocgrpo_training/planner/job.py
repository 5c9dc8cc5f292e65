"""A whole job's plan: the memory of its two phases (plan.py) and the training micro-batch it would run
(micro_batches.py), from one `PlanRequest`."""

from __future__ import annotations

from pathlib import Path

from colocgrpo_training.planner.inputs import PlanInputs, resolve_inputs
from colocgrpo_training.planner.merge import MicroBatchMerge
from colocgrpo_training.planner.micro_batches import plan_micro_batches
from colocgrpo_training.planner.plan import MemoryPlan, cpu_job_plan, plan_inputs
from colocgrpo_training.planner.request import PlanRequest


def plan(request: PlanRequest, *, base_dir: str | Path | None = None) -> MemoryPlan:
    """Plan a job: per-GPU memory of the training and generation phases, the vLLM reservation, and the training
    micro-batch the trainer would run.

    Args:
        request ([`PlanRequest`]):
            The job, typed: `colocgrpo_operator.render.plan_request` builds it from a ColocGRPOJob,
            `request.from_trainer_config` from a trainer config.
        base_dir (`str` or `Path`, *optional*):
            Where a relative local model directory (one with a `config.json`) is looked up, e.g. the job file's
            folder. Defaults to the working directory.

    Returns:
        [`MemoryPlan`]: `fits`; the per-GPU peaks `per_gpu_training_gib`, `per_gpu_generation_gib` and
        `per_gpu_vllm_gib`; `recommended_gpu_memory_utilization` and the workable `utilization_range`
        (`(low, high)`); the `problems` that keep it from fitting, `warnings`, `assumptions`, every `terms` entry
        (phase, name, bytes), and `micro_batches`, the merge the trainer's processes would agree on with the
        request's pin. A CPU job (`gpusPerNode` 0) gets a plan that fits with nothing in it. The formulas and
        their sources: docs/planner.md. `plan.lines()` renders it as text, `plan.to_dict()` as JSON,
        `plan.condition_message()` as one paragraph.

    Raises:
        PlanInputError: the request cannot be planned, e.g. an unknown model without a parameter count or a
            trainer argument of the wrong type; `.field` names the spec field to fix.
    """
    if request.is_cpu_job:
        return cpu_job_plan()
    inputs = resolve_inputs(request, base_dir=Path(base_dir) if base_dir is not None else None)
    memory = plan_inputs(inputs)
    memory.micro_batches = _micro_batches(request, inputs)
    return memory


def _micro_batches(request: PlanRequest, inputs: PlanInputs) -> MicroBatchMerge | None:
    """The merge the trainer's processes would agree on for this job on GPUs of `inputs.gpu_memory_gib`, with its
    pin; None where the trainer refuses the pin (its own error names it)."""
    try:
        return plan_micro_batches(
            request.trainer_args, inputs, world_size=request.resources.world_size, pin=request.micro_batch_merge
        )
    except ValueError:
        return None
