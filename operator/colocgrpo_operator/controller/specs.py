"""A job's spec parsed once per generation: validity, the facts every reconcile needs, the plan warning.

The typed job (a pydantic model, ~10 KiB a job) is only needed to render children, which happens
on create, spec changes and gang restarts, not on the many child events and re-checks in between;
so it is not kept once the facts are taken from it, and is parsed again when children are rendered
(`ParsedSpec.job_model`, ~0.1 ms), rather than kept for every job the operator knows, or for every
new job of a burst while it waits for the API threads.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api import KUEUE_PRIORITY_CLASS_LABEL, KUEUE_QUEUE_LABEL, JobSpecError, parse_job
from colocgrpo_operator.api.queueing import job_queue, job_warnings
from colocgrpo_operator.api.runtime import resolve_job
from colocgrpo_operator.controller import status as derive
from colocgrpo_operator.controller.record import RuntimeSnapshot

# Parsed specs kept before the cache starts over (one per job and generation in use).
_CACHE_LIMIT = 4096


class ParsedSpec:
    """One generation of a job's spec, merged with the runtime it names (`runtime`, the snapshot the
    gang runs with; None for a job that names none) and parsed: the run facts and the plan warning
    of a valid spec (`facts` is None exactly when it is invalid), or the problems that refuse it
    (a locked field the job overrides among them); `warnings`, what a valid spec should change (a
    deprecated field), announced once (`warned`)."""

    def __init__(self, cr: dict[str, Any], runtime: RuntimeSnapshot | None = None):
        self.runtime = runtime
        self.valid = False
        self.problems: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []
        self.warned = False
        self.facts: derive.RunFacts | None = None
        self.plan_warning: tuple[bool, str, str] | None = None
        meta = cr.get("metadata") or {}
        try:
            merged = self.merged(cr)
            job = _parse_user_spec(merged)
        except JobSpecError as error:
            self.problems = list(error.errors) or [("spec", str(error))]
            return
        except Exception as error:  # a validator bug must not take the operator down
            self.problems = [("spec", f"could not be validated: {error}")]
            return
        spec = job.spec
        self.facts = derive.RunFacts(
            nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node,
            max_restarts=spec.run_policy.max_restarts,
            suspend=spec.run_policy.suspend,
            queue_name=job_queue(job),
            stall_timeout_seconds=spec.run_policy.stall_timeout_seconds,
            active_deadline_seconds=spec.run_policy.active_deadline_seconds,
            generation=meta.get("generation"),
            progress_deadline_seconds=spec.run_policy.progress_deadline_seconds,
        )
        self.plan_warning = _plan_warning(merged) if spec.resources.gpus_per_node > 0 else None
        self.warnings = job_warnings(job)
        self.valid = True

    def merged(self, cr: dict[str, Any]) -> dict[str, Any]:
        """The job as it runs: its spec over the runtime's template (api/runtime.py). Raises
        JobSpecError naming each locked field the job overrides, or a runtime that is invalid."""
        if self.runtime is None:
            return cr
        namespace = (cr.get("metadata") or {}).get("namespace")
        merged, problems = resolve_job(cr, self.runtime.as_object(namespace))
        if problems:
            raise JobSpecError(problems)
        return merged

    def job_model(self, cr: dict[str, Any]) -> Any:
        """The typed job as it runs (only for a valid spec), merged and parsed again: the caller
        holds it as long as it needs it."""
        return _parse_user_spec(self.merged(cr))


class SpecCache:
    """Every job's `ParsedSpec`, by (uid, generation, Kueue's labels, the runtime snapshot's identity):
    a spec is parsed once, however many reconciles read it. (A label change does not move the
    generation, and Kueue's two say where the job queues; a runtime's uid and generation say which
    of its specs the job is merged with.)"""

    def __init__(self) -> None:
        self._specs: dict[tuple[Any, ...], ParsedSpec] = {}

    def parsed(self, cr: dict[str, Any], runtime: RuntimeSnapshot | None = None) -> ParsedSpec:
        """The job's spec, merged with `runtime`, parsed once per cache key, cached."""
        meta = cr.get("metadata") or {}
        labels = meta.get("labels") or {}
        cache_key = (
            meta.get("uid") or "",
            meta.get("generation"),
            labels.get(KUEUE_QUEUE_LABEL),
            labels.get(KUEUE_PRIORITY_CLASS_LABEL),
            None if runtime is None else (runtime.kind, runtime.name, runtime.uid, runtime.generation),
        )
        parsed = self._specs.get(cache_key)
        if parsed is None:
            if len(self._specs) > _CACHE_LIMIT:
                self._specs.clear()
            parsed = self._specs[cache_key] = ParsedSpec(cr, runtime)
        return parsed


def _parse_user_spec(cr: dict[str, Any]) -> Any:
    # Status is the operator's own output; only what the user wrote is validated.
    return parse_job({k: v for k, v in cr.items() if k != "status"})


def _plan_warning(cr: dict[str, Any]) -> tuple[bool, str, str] | None:
    """(warn, reason, message) from the memory planner, or None if it is unavailable.

    The planner lives in colocgrpo_training (light, torch-free); it is optional for the
    operator, and a planner error never blocks a job (it only loses its warning).
    """
    try:
        from colocgrpo_operator.render.plan_request import plan_job
    except ImportError:
        return None
    try:
        plan = plan_job(cr)
    except Exception as error:  # PlanInputError or a planner bug: say so, do not fail
        return True, "PlanUnavailable", f"the memory plan could not be computed: {error}"
    if not plan.fits:
        return True, "DoesNotFit", plan.condition_message()
    if plan.warnings:
        return True, "MemoryWarning", plan.condition_message()
    return False, "Fits", plan.condition_message() or "the memory plan fits"
