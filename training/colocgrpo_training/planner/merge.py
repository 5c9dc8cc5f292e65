"""The micro-batch merge a job runs, and whether its backward recomputes: the decision and how it rewrites
GRPOConfig's arguments.

What it is, apart from how it is decided (micro_batches.py, which plans with plan.py): the memory plan carries one
(`MemoryPlan.micro_batches`) without importing the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class MicroBatchMerge:
    """The decision: merge `factor` micro-batches into one, and why (`reason`)."""

    factor: int
    per_device_train_batch_size: int  # before the merge
    gradient_accumulation_steps: int
    steps_per_generation: int
    reason: str
    # (k, training-phase peak in GiB) for every factor the planner was asked about, largest first.
    peaks_gib: tuple[tuple[int, float], ...] = ()
    limit_gib: float | None = None
    # The training peak in GiB without gradient checkpointing where the planner turned it off (the job left
    # `gradient_checkpointing` unset and the merged micro-batch's activations fit without it); None: as configured.
    recompute_off_peak_gib: float | None = None

    @property
    def merged(self) -> bool:
        return self.factor > 1

    @property
    def recompute_off(self) -> bool:
        """Whether the planner turned gradient checkpointing off."""
        return self.recompute_off_peak_gib is not None

    @property
    def changes(self) -> bool:
        """Whether `rewrite` changes anything."""
        return self.merged or self.recompute_off

    def rewrite(self, grpo: Mapping[str, Any]) -> dict[str, Any]:
        """`grpo` (GRPOConfig keyword arguments) with the merged micro-batch. steps_per_generation is written only
        where it was set: unset, TRL derives it from G (the default) or from generation_batch_size, which both
        give S/k after the rewrite."""
        out = dict(grpo)
        if self.recompute_off:
            out["gradient_checkpointing"] = False
        if not self.merged:
            return out
        k = self.factor
        out["per_device_train_batch_size"] = self.per_device_train_batch_size * k
        out["gradient_accumulation_steps"] = self.gradient_accumulation_steps // k
        if grpo.get("steps_per_generation") is not None:
            out["steps_per_generation"] = self.steps_per_generation // k
        return out

    def message(self) -> str:
        b, g, s, k = (
            self.per_device_train_batch_size,
            self.gradient_accumulation_steps,
            self.steps_per_generation,
            self.factor,
        )
        if not self.merged:
            text = f"training micro-batches kept at {b} rows ({g} per optimizer step): {self.reason}"
        else:
            text = (
                f"training micro-batches merged {k} into 1: {g // k} x {b * k} rows per optimizer step instead of "
                f"{g} x {b}, steps_per_generation {s} -> {s // k}, the generation batch unchanged; {self.reason}"
            )
        return text + (f"; {self.recompute_message()}" if self.recompute_off else "")

    def recompute_message(self) -> str:
        """Why the backward does not recompute (only where `recompute_off`)."""
        peak = f"training peak {self.recompute_off_peak_gib:.1f} GiB"
        limit = "" if self.limit_gib is None else f" within {self.limit_gib:.1f} GiB"
        return (
            f"gradient checkpointing off: every layer's activations fit ({peak}{limit} without it), so the backward "
            "recomputes no forward"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "per_device_train_batch_size": [
                self.per_device_train_batch_size,
                self.per_device_train_batch_size * self.factor,
            ],
            "gradient_accumulation_steps": [
                self.gradient_accumulation_steps,
                self.gradient_accumulation_steps // self.factor,
            ],
            "steps_per_generation": [self.steps_per_generation, self.steps_per_generation // self.factor],
            "reason": self.reason,
            "training_peak_gib": {str(k): round(v, 2) for k, v in self.peaks_gib},
            "limit_gib": None if self.limit_gib is None else round(self.limit_gib, 2),
            "gradient_checkpointing_off": self.recompute_off,
            "training_peak_gib_without_checkpointing": None
            if self.recompute_off_peak_gib is None
            else round(self.recompute_off_peak_gib, 2),
        }
