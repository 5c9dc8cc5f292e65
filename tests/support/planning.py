"""Plans of bare specs for the planner's tests: a spec (camelCase, as a job file holds it) with only the fields a test
is about becomes a whole ColocGRPOJob (a dataset and a reward filled in), planned the way the operator plans it
(`colocgrpo_operator.render.plan_job`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colocgrpo_operator.api import ColocGRPOJob
from colocgrpo_operator.render import plan_job, plan_request
from colocgrpo_training.planner import MemoryPlan, PlanInputs, resolve_inputs


def job_of(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` as a job: a dataset name and a reward where it has none (the planner reads neither)."""
    whole = {**spec, "dataset": {"name": "prompts", **spec.get("dataset", {})}}
    whole.setdefault("rewards", [{"function": "accuracy"}])
    return {"metadata": {"name": "planned"}, "spec": whole}


def plan_from_spec(spec: dict[str, Any], **kwargs: Any) -> MemoryPlan:
    """The plan of a bare spec (`plan_job`'s keyword arguments: gpu_memory_gib, base_dir)."""
    return plan_job(job_of(spec), **kwargs)


def inputs_from_spec(
    spec: dict[str, Any], *, gpu_memory_gib: float | None = None, base_dir: Path | None = None
) -> PlanInputs:
    """The planner's resolved numbers for a bare spec."""
    job = ColocGRPOJob.model_validate(job_of(spec))
    return resolve_inputs(plan_request(job, gpu_memory_gib=gpu_memory_gib), base_dir=base_dir)
