"""Per-GPU memory planner for colocated GRPO (DeepSpeed training + vLLM generation on the same GPUs).

Pure Python — no torch, no transformers — so the operator can import it to set the PlanWarning condition. It takes
one typed input, a `PlanRequest`, built by one adapter per side:

    from colocgrpo_operator.render import plan_job          # a ColocGRPOJob (or its dict): the operator, colocgrpo plan
    from colocgrpo_training.planner import plan, from_trainer_config
    memory = plan(from_trainer_config(config))                # a TrainerConfig: the trainer
    memory.fits, memory.warnings, memory.recommended_gpu_memory_utilization, memory.lines()

docs/planner.md gives the formulas and their sources.
"""

from colocgrpo_training.planner.inputs import DEFAULT_GPU_MEMORY_GIB, PlanInputs, resolve_inputs
from colocgrpo_training.planner.job import plan
from colocgrpo_training.planner.merge import MicroBatchMerge
from colocgrpo_training.planner.plan import MemoryPlan, Term, plan_inputs
from colocgrpo_training.planner.request import PlanRequest, from_trainer_config
from colocgrpo_training.planner.shapes import BUILTIN_SHAPES, ModelShape, PlanInputError

__all__ = [
    "BUILTIN_SHAPES",
    "DEFAULT_GPU_MEMORY_GIB",
    "MemoryPlan",
    "MicroBatchMerge",
    "ModelShape",
    "PlanInputError",
    "PlanInputs",
    "PlanRequest",
    "Term",
    "from_trainer_config",
    "plan",
    "plan_inputs",
    "resolve_inputs",
]
