"""The micro-batch merge a job runs, and how much of its forward the backward recomputes: the decision and how it
rewrites GRPOConfig's arguments.

What it is, apart from how it is decided (micro_batches.py, which plans with plan.py): the memory plan carries one
(`MemoryPlan.micro_batches`) without importing the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Recompute:
    """Less gradient checkpointing than GRPOConfig's default (every decoder layer), where memory allows: the first
    `checkpointed_layers` decoder layers recompute their forward in the backward, the others keep their activations
    (none checkpointed: `gradient_checkpointing` off)."""

    checkpointed_layers: int
    num_layers: int
    peak_gib: float  # the planner's training peak with it

    @property
    def off(self) -> bool:
        return self.checkpointed_layers == 0

    def settings(self) -> dict[str, Any]:
        """The GRPOConfig arguments it changes; the trainer keeps the later layers whole itself
        (`ColocGRPOTrainer(checkpointed_layers=...)`)."""
        return {"gradient_checkpointing": False} if self.off else {}

    def message(self, limit_gib: float | None) -> str:
        peak = f"training peak {self.peak_gib:.1f} GiB{'' if limit_gib is None else f' within {limit_gib:.1f} GiB'}"
        if self.off:
            return (
                f"gradient checkpointing off: every layer's activations fit ({peak} without it), so the backward "
                "recomputes no forward"
            )
        return (
            f"gradient checkpointing on the first {self.checkpointed_layers} of {self.num_layers} layers: the last "
            f"{self.num_layers - self.checkpointed_layers} keep their activations ({peak}), so the backward "
            f"recomputes {self.checkpointed_layers} layers' forwards instead of {self.num_layers}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpointed_layers": self.checkpointed_layers,
            "layers": self.num_layers,
            "training_peak_gib": round(self.peak_gib, 2),
        }


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
    # Less gradient checkpointing, where the job left it to the planner and the merged micro-batch's activations
    # fit with less of it; None: as configured.
    recompute: Recompute | None = None

    @property
    def merged(self) -> bool:
        return self.factor > 1

    @property
    def recompute_off(self) -> bool:
        """Whether the planner turned gradient checkpointing off altogether."""
        return self.recompute is not None and self.recompute.off

    @property
    def changes(self) -> bool:
        """Whether `rewrite` changes anything."""
        return self.merged or self.recompute is not None

    def rewrite(self, grpo: Mapping[str, Any]) -> dict[str, Any]:
        """`grpo` (GRPOConfig keyword arguments) with the merged micro-batch. steps_per_generation is written only
        where it was set: unset, TRL derives it from G (the default) or from generation_batch_size, which both
        give S/k after the rewrite."""
        out = dict(grpo)
        if self.recompute is not None:
            out.update(self.recompute.settings())
        if not self.merged:
            return out
        k = self.factor
        out["per_device_train_batch_size"] = self.per_device_train_batch_size * k
        out["gradient_accumulation_steps"] = self.gradient_accumulation_steps // k
        if grpo.get("steps_per_generation") is not None:
            out["steps_per_generation"] = self.steps_per_generation // k
        return out

    def trainer_options(self) -> dict[str, Any]:
        """`ColocGRPOTrainer` keyword arguments that run the decision beside the rewritten GRPOConfig: the number of
        checkpointed layers where only some are."""
        if self.recompute is None or self.recompute.off:
            return {}
        return {"checkpointed_layers": self.recompute.checkpointed_layers}

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
        return text + ("" if self.recompute is None else f"; {self.recompute.message(self.limit_gib)}")

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
            "recompute": None if self.recompute is None else self.recompute.to_dict(),
        }
