"""Reward functions: built-ins by name, user functions by `module:function`.

`resolve_rewards` turns the config's reward list into the callables and weights TRL's
GRPOTrainer takes (`reward_funcs`, `GRPOConfig.reward_weights`). User modules come from
`reward_modules_dir` (the job's mounted reward ConfigMap), put first on sys.path. Each callable
it returns turns what its function raises into a `RewardFunctionError` naming the function, so
that the failure reads as the reward function's and not as the code around it (vLLM, TRL).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Any, cast

from colocgrpo_training.config import RewardSettings
from colocgrpo_training.failures import RewardFunctionError
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
        where = f"rewards[{index}]"
        functions.append(guard_reward(resolve_reward(entry.function, where=where), where, entry.function))
        weights.append(float(entry.weight))
    return functions, weights


def reward_name(function: Any) -> str:
    """`module:function` of a reward callable (a partial's function, a callable object's class)."""
    while isinstance(function, functools.partial) or hasattr(function, "__wrapped__"):
        function = function.func if isinstance(function, functools.partial) else function.__wrapped__
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else type(function)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__name__)}"


def guard_reward(function: RewardFunction, where: str, spec: str = "") -> RewardFunction:
    """`function` as TRL calls it (async when it is), raising `RewardFunctionError` where it raises or returns other
    than one reward per completion; the message names it (`reward_name`) and its entry `where`. TRL names the
    per-reward metrics after `__name__`: the function's own, or for a callable without one the attribute `spec`
    ("module:attribute") names."""
    label = f"reward function {reward_name(function)} ({where})"

    def checked(rewards: Any, completions: Any) -> Sequence[float | None]:
        try:
            rewards = rewards if hasattr(rewards, "__len__") else list(rewards)
        except TypeError:
            raise RewardFunctionError(f"{label} returned {type(rewards).__name__}, not a list of rewards") from None
        if completions is not None and len(rewards) != len(completions):
            raise RewardFunctionError(f"{label} returned {len(rewards)} rewards for {len(completions)} completions")
        return rewards

    def failed(err: Exception) -> RewardFunctionError:
        return RewardFunctionError(f"{label} raised {type(err).__name__}: {err}")

    if _is_async(function):
        coroutine_function: Any = function  # RewardFunction types the synchronous form

        @functools.wraps(function)
        async def guarded_async(*args: Any, **kwargs: Any) -> Sequence[float | None]:
            try:
                rewards = await coroutine_function(*args, **kwargs)
            except Exception as err:
                raise failed(err) from err
            return checked(rewards, kwargs.get("completions"))

        guarded_async.__name__ = getattr(function, "__name__", spec.rpartition(":")[2] or "reward")
        return cast(RewardFunction, guarded_async)  # TRL awaits it (is_async_callable)

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Sequence[float | None]:
        try:
            rewards = function(*args, **kwargs)
        except Exception as err:
            raise failed(err) from err
        return checked(rewards, kwargs.get("completions"))

    guarded.__name__ = getattr(function, "__name__", spec.rpartition(":")[2] or "reward")
    return guarded


def _is_async(function: Any) -> bool:
    """Whether calling `function` returns a coroutine (TRL's test: a partial's function, a callable's `__call__`)."""
    while isinstance(function, functools.partial):
        function = function.func
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(function.__call__)


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
    return target


__all__ = [
    "BUILTIN_REWARDS",
    "RewardError",
    "accuracy_needed",
    "guard_reward",
    "resolve_reward",
    "resolve_rewards",
    "reward_name",
]
