"""Reward functions: built-ins by name, user functions by `module:function`.

`resolve_rewards` turns the config's reward list into the callables and weights TRL's
GRPOTrainer takes (`reward_funcs`, `GRPOConfig.reward_weights`). User modules come from
`reward_modules_dir` (the job's mounted reward ConfigMap), put first on sys.path.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Any

from colocgrpo_training.config import RewardSettings
from colocgrpo_training.rewards.builtin import BUILTIN_REWARDS, RewardFunction


class RewardError(ValueError):
    """A reward entry cannot be resolved; the message names the entry (rewards[i])."""


def resolve_rewards(
    entries: list[RewardSettings], reward_modules_dir: str | None = None
) -> tuple[list[RewardFunction], list[float]]:
    if reward_modules_dir and reward_modules_dir not in sys.path:
        sys.path.insert(0, reward_modules_dir)
    functions: list[RewardFunction] = []
    weights: list[float] = []
    for index, entry in enumerate(entries):
        functions.append(resolve_reward(entry.function, where=f"rewards[{index}]"))
        weights.append(float(entry.weight))
    return functions, weights


def accuracy_needed(entries: list[RewardSettings]) -> bool:
    """Whether the dataset must supply gold solutions."""
    return any(entry.function == "accuracy" for entry in entries)


def resolve_reward(spec: str, *, where: str = "reward") -> RewardFunction:
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" not in spec:
        raise RewardError(
            f"{where}.function {spec!r} is neither a built-in reward {sorted(BUILTIN_REWARDS)} "
            f"nor a 'module:function' reference"
        )
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise RewardError(f"{where}.function {spec!r} must look like 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a syntax error in the user's module is as fatal as a missing one
        raise RewardError(f"{where}.function {spec!r}: cannot import module {module_name!r}: {err}") from err
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise RewardError(
                f"{where}.function {spec!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise RewardError(f"{where}.function {spec!r} is not callable")
    return _named(target, spec)


def _named(function: RewardFunction, spec: str) -> RewardFunction:
    """TRL names per-reward metrics after `__name__`; keep the user's function name."""
    plain_function = inspect.isfunction(function)  # a bool, so `function` keeps its RewardFunction type
    if plain_function:
        return function

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Sequence[float | None]:
        return function(*args, **kwargs)

    wrapper.__name__ = getattr(function, "__name__", spec.rpartition(":")[2])
    return wrapper


__all__ = ["BUILTIN_REWARDS", "RewardError", "accuracy_needed", "resolve_reward", "resolve_rewards"]
