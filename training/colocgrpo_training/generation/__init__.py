"""Generation wrapper: the only code in the project that touches vLLM.

- `policy`: the sleep-policy engine (pure Python): engine record, wake plans, sleep
  decisions, the never-stale invariant, measured costs, counters.
- `schedules`: TRL training schedules as event sequences (CPU property test and GPU suite).
- `buckets`, `tp_groups`: pure rules for bucketed weight pushes and TP groups.
- `ColocatedVLLM` (vllm_engine.py): owns the colocated engine's whole life.
- `ColocGRPOTrainer` (trainer.py): TRL's GRPOTrainer routed through `ColocatedVLLM`.

Importing this package imports neither torch nor vLLM: the two heavy classes load on
first attribute access, and vLLM itself only when an engine is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colocgrpo_training.generation.policy import (
    CostModel,
    EngineState,
    RedundantPushError,
    SleepController,
    SleepDecision,
    StaleWeightsError,
    WakePlan,
)

if TYPE_CHECKING:
    from colocgrpo_training.generation.trainer import ColocGRPOTrainer
    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

__all__ = [
    "ColocGRPOTrainer",
    "ColocatedVLLM",
    "CostModel",
    "EngineState",
    "RedundantPushError",
    "SleepController",
    "SleepDecision",
    "StaleWeightsError",
    "WakePlan",
]

_LAZY = {
    "ColocGRPOTrainer": "colocgrpo_training.generation.trainer",
    "ColocatedVLLM": "colocgrpo_training.generation.vllm_engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
