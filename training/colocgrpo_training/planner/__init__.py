"""Per-GPU memory planner for colocated GRPO (DeepSpeed training + vLLM generation on the same GPUs).

Pure Python — no torch, no transformers — so the operator can import it to set the PlanWarning condition:

    from colocgrpo_training.planner import plan_job, plan_from_spec
    plan = plan_job(job)          # job: ColocGRPOJob or a job dict
    plan.fits, plan.warnings, plan.recommended_gpu_memory_utilization, plan.lines()

docs/planner.md gives the formulas and their sources.
"""

from colocgrpo_training.planner.inputs import DEFAULT_GPU_MEMORY_GIB, GPU_MEMORY_ANNOTATION, PlanInputs
from colocgrpo_training.planner.plan import MemoryPlan, Term, plan_from_spec, plan_inputs, plan_job
from colocgrpo_training.planner.shapes import BUILTIN_SHAPES, ModelShape, PlanInputError

__all__ = [
    "BUILTIN_SHAPES",
    "DEFAULT_GPU_MEMORY_GIB",
    "GPU_MEMORY_ANNOTATION",
    "MemoryPlan",
    "ModelShape",
    "PlanInputError",
    "PlanInputs",
    "Term",
    "plan_from_spec",
    "plan_inputs",
    "plan_job",
]
