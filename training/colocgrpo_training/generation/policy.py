"""The sleep-policy engine: which weights vLLM holds, and what to do around each generate.

Pure Python (no torch, no vLLM) so that every decision is tested on CPU against a fake
engine (`tests/support/fake_engine.py`) over random training schedules (`schedules.py`).

Vocabulary
- *trainer weight version*: a value that changes whenever the trainer's weights change
  (the trainer uses its optimizer-step counter). The engine record stores the version its
  weights equal, or `None` when they equal no known trainer version (the base checkpoint
  loaded at build time, or discarded by a level-2 sleep).
- *residence* of vLLM's weights: on the GPU, on pinned CPU memory (level-1 sleep: still
  valid), or discarded (level-2 sleep: content lost, must be pushed after waking).

The invariant, enforced by `SleepController.check_ready` right before every generate:
vLLM's weights are resident on the GPU, the KV cache is awake, and the held version equals
the trainer's current version. A violation raises `StaleWeightsError` (and is logged).
The dual guard: a push of weights the engine already holds raises `RedundantPushError`.

Cost accounting of one *cycle* (after a generate, until the next generate is ready):
    level 1: sleep1 + wake1                 (+ push if the trainer stepped meanwhile)
    level 2: sleep2 + wake2 + push          (the weights are gone: always a full push)
`auto` picks, per cycle, the level whose modeled cycle cost is lower given whether an
optimizer step (hence a push) is due before the next generate. When a push is due both
sides carry it, so level 2 wins whenever its sleep+wake is cheaper than level 1's (always
on real hardware: level 2 moves no weight bytes). Otherwise it compares a level-1
round trip against a level-2 round trip plus a push. Because each cycle's cost depends
only on that cycle's choice and on whether a step happens, auto's total is at most
min(total of level1, total of level2) under the same cost model (docs/sleep-policy.md).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from colocgrpo_training.config import SleepPolicy

log = logging.getLogger("colocgrpo.generation")

Version = Hashable


class Residence(enum.StrEnum):
    GPU = "gpu"
    CPU = "cpu"  # level-1 sleep: a valid copy in pinned host memory
    DISCARDED = "discarded"  # level-2 sleep: content lost


class StaleWeightsError(RuntimeError):
    """A generate would have used weights other than the trainer's current ones."""


class RedundantPushError(RuntimeError):
    """A push of weights the engine already holds (a wasted full weight transfer)."""


class EngineOrderError(RuntimeError):
    """vLLM operations in an order vLLM rejects (e.g. KV cache woken before the weights)."""


@dataclass
class EngineState:
    """What the colocated engine holds right now."""

    held_version: Version | None = None  # None: base checkpoint / discarded / unknown
    residence: Residence = Residence.GPU
    kv_cache_awake: bool = True

    @property
    def weights_awake(self) -> bool:
        return self.residence is Residence.GPU

    def holds(self, version: Version) -> bool:
        """The engine's weights (wherever they sit) equal the trainer's `version`."""
        return self.residence is not Residence.DISCARDED and self.held_version == version


@dataclass(frozen=True)
class WakePlan:
    """What to do before a generate, in vLLM's required order: weights → push → kv cache."""

    wake_weights: bool
    push: bool
    wake_kv_cache: bool
    reason: str

    @property
    def steps(self) -> tuple[str, ...]:
        order = (("wake_weights", self.wake_weights), ("push", self.push), ("wake_kv_cache", self.wake_kv_cache))
        return tuple(name for name, wanted in order if wanted)


@dataclass(frozen=True)
class SleepDecision:
    level: int  # 0: stay awake (policy off), 1 or 2
    reason: str
    modeled_cost_level1: float | None = None
    modeled_cost_level2: float | None = None


def plan_wake(state: EngineState, trainer_version: Version) -> WakePlan:
    """The minimal correct sequence to make the engine generate from `trainer_version`.

    The same for every policy: the policy acts only through how the engine was put to sleep.
    """
    wake_weights = not state.weights_awake
    push = not state.holds(trainer_version)
    if state.residence is Residence.DISCARDED:
        reason = "weights discarded by level-2 sleep"
    elif push:
        reason = f"engine holds version {state.held_version!r}, trainer is at {trainer_version!r}"
    else:
        reason = f"engine already holds version {trainer_version!r}"
    return WakePlan(wake_weights=wake_weights, push=push, wake_kv_cache=not state.kv_cache_awake, reason=reason)


# Priors used until a cost has been measured. Wake/sleep level 1 move the weights over
# PCIe/C2C (measured 16.5 GB/s for vLLM's own wake on an H200, docs/sleep-policy.md);
# a push is a device-local copy plus, under ZeRO-3, an all-gather: assume a conservative
# 25 GB/s until measured. Level-2 sleep/wake only unmap and remap memory.
PRIOR_HOST_LINK_BYTES_PER_S = 16.5e9
PRIOR_PUSH_BYTES_PER_S = 25e9
PRIOR_REMAP_SECONDS = 0.01


class CostKind(enum.StrEnum):
    SLEEP1 = "sleep1"
    WAKE1 = "wake1"
    SLEEP2 = "sleep2"
    WAKE2 = "wake2"
    PUSH = "push"


# The first level-1 sleep in a process also allocates vLLM's pinned host buffers, which makes
# it many times slower than later ones (measured: docs/benchmarks/gpu.md). Modeled as a steady
# cost it would keep `auto` off level 1 for the rest of the run, so that first sample is kept
# apart as a one-off.
ONE_OFF_FIRST_SAMPLE = frozenset({CostKind.SLEEP1})


@dataclass
class CostModel:
    """Seconds per operation: priors, replaced by the first measurement, then an EWMA.
    For `ONE_OFF_FIRST_SAMPLE` kinds the first measurement is a one-off (`one_off`), and the
    prior stands until the second."""

    seconds: dict[CostKind, float]
    measured: dict[CostKind, int] = field(default_factory=dict)
    alpha: float = 0.3
    frozen: bool = False  # a fixed model (tests, what-if analysis) ignores measurements
    one_off: dict[CostKind, float] = field(default_factory=dict)

    @classmethod
    def from_weight_bytes(cls, weight_bytes: int, tensor_parallel_size: int = 1) -> CostModel:
        """Priors for a model of `weight_bytes` (full size). A level-1 sleep or wake moves only
        this rank's vLLM shard over the host link, 1/tp of the weights; a push gathers and
        loads all of them on every rank."""
        host = weight_bytes / tensor_parallel_size / PRIOR_HOST_LINK_BYTES_PER_S
        return cls(
            seconds={
                CostKind.SLEEP1: host,
                CostKind.WAKE1: host,
                CostKind.SLEEP2: PRIOR_REMAP_SECONDS,
                CostKind.WAKE2: PRIOR_REMAP_SECONDS,
                CostKind.PUSH: weight_bytes / PRIOR_PUSH_BYTES_PER_S,
            }
        )

    @classmethod
    def fixed(cls, **seconds: float) -> CostModel:
        return cls(seconds={CostKind(k): float(v) for k, v in seconds.items()}, frozen=True)

    def record(self, kind: CostKind, seconds: float) -> None:
        if self.frozen:
            return
        if kind in ONE_OFF_FIRST_SAMPLE and kind not in self.one_off:
            self.one_off[kind] = seconds
            return
        n = self.measured.get(kind, 0)
        old = self.seconds[kind]
        self.seconds[kind] = seconds if n == 0 else (1 - self.alpha) * old + self.alpha * seconds
        self.measured[kind] = n + 1

    def cycle_cost(self, level: int, push_due: bool, final: bool = False) -> float:
        """Modeled seconds from a sleep at `level` until the next generate is ready; only
        the sleep itself when no generate follows (`final`)."""
        s = self.seconds
        if final and level in (1, 2):
            return s[CostKind.SLEEP1] if level == 1 else s[CostKind.SLEEP2]
        if level == 1:
            return s[CostKind.SLEEP1] + s[CostKind.WAKE1] + (s[CostKind.PUSH] if push_due else 0.0)
        if level == 2:
            return s[CostKind.SLEEP2] + s[CostKind.WAKE2] + s[CostKind.PUSH]
        raise ValueError(f"no cycle cost for sleep level {level}")


def choose_sleep_level(
    policy: SleepPolicy, push_due: bool | None, costs: CostModel, final: bool = False
) -> SleepDecision:
    """The sleep level after a generate. `push_due`: will the trainer's weights change
    (an optimizer step) before the next generate? None when the caller cannot tell, which
    auto treats as "no" (a wrong guess costs time, never correctness). `final`: no generate
    follows (the sleep only frees memory for the rest of training)."""
    if policy is SleepPolicy.OFF:
        return SleepDecision(0, "policy off: engine stays resident")
    if policy is SleepPolicy.LEVEL1:
        return SleepDecision(1, "policy level1")
    if policy is SleepPolicy.LEVEL2:
        return SleepDecision(2, "policy level2")
    due = bool(push_due)
    c1, c2 = costs.cycle_cost(1, due, final), costs.cycle_cost(2, due, final)
    level = 2 if c2 <= c1 else 1
    if final:
        why = "no generate follows"
    else:
        why = "push due before next generate" if due else "no push due before next generate"
    return SleepDecision(level, f"auto: {why}; modeled level1 {c1:.4f}s vs level2 {c2:.4f}s", c1, c2)


class EngineDriver(Protocol):
    """The engine operations the controller drives (vLLM in `ColocatedVLLM`, a fake on CPU)."""

    def wake_weights(self) -> None: ...

    def push_weights(self) -> int:  # returns bytes pushed
        ...

    def wake_kv_cache(self) -> None: ...

    def sleep(self, level: int) -> None: ...


@dataclass
class GenerationCounters:
    """Exposed for metrics and the benchmark."""

    generates: int = 0
    pushes: int = 0
    bytes_pushed: int = 0
    sleeps: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0})
    wakes: int = 0
    push_seconds: float = 0.0
    wake_seconds: float = 0.0
    sleep_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "generates": self.generates,
            "pushes": self.pushes,
            "bytes_pushed": self.bytes_pushed,
            "sleeps_level1": self.sleeps[1],
            "sleeps_level2": self.sleeps[2],
            "wakes": self.wakes,
            "push_seconds": self.push_seconds,
            "wake_seconds": self.wake_seconds,
            "sleep_seconds": self.sleep_seconds,
        }


class SleepController:
    """The sleep policy's engine: owns the engine record and drives an `EngineDriver` around each generate.

    Per generate: `prepare(driver, v)` → `check_ready(v)` → generate → `finish(driver, push_due)`, where `v` is
    the trainer's weight version at that generate. `prepare` wakes and pushes only what the record says is
    missing, `check_ready` enforces the invariant (never generate from stale weights), `finish` sleeps at the
    level the policy picks. Every operation is timed into `costs`, which `auto` decides from, and counted in
    `counters`. Pure Python: the CPU tests drive it against a fake engine over random schedules. The policies'
    measured costs: docs/benchmarks/gpu.md; the rules: docs/sleep-policy.md.

    Args:
        policy ([`SleepPolicy`] or `str`):
            `"off"` (never sleep), `"level1"`, `"level2"` or `"auto"` (per cycle, the level of lower modeled
            cost).
        costs ([`CostModel`]):
            Seconds per operation: priors from the weight size (`CostModel.from_weight_bytes`), refined by
            every measurement unless frozen (`CostModel.fixed`).
        state ([`EngineState`], *optional*):
            The engine's record at the start. Defaults to weights on the GPU holding no known trainer version
            (a freshly loaded checkpoint), so the first generate pushes.
        agree (`Callable[[float], float]`, *optional*):
            Makes a measured duration equal on every rank before it enters `costs`. With several ranks (TP
            groups, ZeRO-3) every rank must take the same decisions, since a push is a collective: pass e.g. an
            all-reduce MAX over the world group. Defaults to the identity (one process).
        clock (`Callable[[], float]`, *optional*, defaults to `time.perf_counter`):
            Seconds, for timing the driver's operations.

    Raises:
        ValueError: `policy` is not a sleep policy.
    """

    def __init__(
        self,
        policy: SleepPolicy | str,
        costs: CostModel,
        state: EngineState | None = None,
        agree: Callable[[float], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = SleepPolicy(policy)
        self.costs = costs
        self.state = state or EngineState()
        self.counters = GenerationCounters()
        self._agree = agree or (lambda x: x)
        self._clock = clock
        self._last_level: int | None = None

    # -- record changes made outside the controller -------------------------------------
    def invalidate(self, why: str) -> None:
        """Record that the engine's weights equal no known trainer version (e.g. the trainer loaded a
        checkpoint), so the next generate pushes.

        Args:
            why (`str`):
                The reason, for the log.
        """
        log.info("sleep-policy: engine weights invalidated: %s", why)
        self.state.held_version = None

    # -- the cycle -------------------------------------------------------------------------
    def initial_sleep(self, driver: EngineDriver) -> None:
        """Put a freshly built engine to sleep before the trainer sets up (nothing with the policy `off`).

        An engine holding no known version (the base checkpoint, unless the caller built the
        record with `EngineState(held_version=...)`) must be pushed before its first generate
        anyway: discard it (level 2, free). One that holds the trainer's weights sleeps as
        after any generate with no push due.

        Args:
            driver ([`EngineDriver`]):
                The engine to put to sleep.
        """
        if self.policy is SleepPolicy.OFF:
            return
        if self.state.held_version is None:
            self._sleep(driver, 2, "initial: base weights are replaced by the first push")
        else:
            self.finish(driver, push_due=False)

    def prepare(self, driver: EngineDriver, trainer_version: Version) -> WakePlan:
        """Make the engine ready to generate from `trainer_version`, in vLLM's order: wake the weights if
        asleep, push if the engine does not hold that version, wake the KV cache if asleep.

        Args:
            driver ([`EngineDriver`]):
                The engine to wake and push into. A push is a collective under ZeRO-3: every rank calls this.
            trainer_version (`Hashable`):
                The trainer's current weight version (its optimizer-step count).

        Returns:
            [`WakePlan`]: the steps taken (`plan.steps`) and why.

        Raises:
            EngineOrderError: the driver's state contradicts the plan (a bug in the record).
        """
        plan = plan_wake(self.state, trainer_version)
        if plan.wake_weights:
            level = self._last_level
            seconds = self._timed(driver.wake_weights)
            # After a level-2 sleep the woken weights are garbage: held_version is already None,
            # so the plan's push below replaces them.
            self.state.residence = Residence.GPU
            self.counters.wakes += 1
            self.counters.wake_seconds += seconds
            kind = CostKind.WAKE1 if level == 1 else CostKind.WAKE2
            self.costs.record(kind, seconds)
            log.info("sleep-policy: wake weights (after level %s) %.4fs", level, seconds)
        if plan.push:
            self.push(driver, trainer_version, reason=plan.reason)
        if plan.wake_kv_cache:
            if not self.state.weights_awake:
                raise EngineOrderError("KV cache woken before the weights")
            seconds = self._timed(driver.wake_kv_cache)
            self.state.kv_cache_awake = True
            self.counters.wake_seconds += seconds
            log.info("sleep-policy: wake kv cache %.4fs", seconds)
        return plan

    def push(self, driver: EngineDriver, trainer_version: Version, reason: str = "") -> None:
        """Push the trainer's weights into the awake engine and record it as holding `trainer_version`.

        Args:
            driver ([`EngineDriver`]):
                The engine; `driver.push_weights()` returns the bytes it moved.
            trainer_version (`Hashable`):
                The version being pushed.
            reason (`str`, *optional*):
                Why, for the log.

        Raises:
            RedundantPushError: the engine already holds `trainer_version` (a wasted full transfer).
            EngineOrderError: the engine's weights are asleep.
        """
        if self.state.weights_awake and self.state.holds(trainer_version):
            log.error("sleep-policy: refusing to push version %r the engine already holds", trainer_version)
            raise RedundantPushError(f"engine already holds trainer weights version {trainer_version!r}")
        if not self.state.weights_awake:
            raise EngineOrderError("weights pushed into a sleeping engine; wake the weights first")
        start = self._clock()
        nbytes = driver.push_weights()
        seconds = self._agree(self._clock() - start)
        self.state.held_version = trainer_version
        self.counters.pushes += 1
        self.counters.bytes_pushed += nbytes
        self.counters.push_seconds += seconds
        self.costs.record(CostKind.PUSH, seconds)
        log.info("sleep-policy: push version %r, %d bytes, %.4fs (%s)", trainer_version, nbytes, seconds, reason)

    def check_ready(self, trainer_version: Version) -> None:
        """The invariant, checked right before every generate: weights on the GPU, KV cache awake, and the
        engine holding `trainer_version`. Counts the generate.

        Raises:
            StaleWeightsError: any of the three does not hold; the message says which (also logged).
        """
        s = self.state
        problem = None
        if not s.weights_awake:
            problem = f"weights are not on the GPU (residence {s.residence.value})"
        elif not s.kv_cache_awake:
            problem = "KV cache is asleep"
        elif not s.holds(trainer_version):
            problem = f"engine holds weights version {s.held_version!r}, trainer is at {trainer_version!r}"
        if problem:
            log.error("sleep-policy: invariant violated before generate: %s", problem)
            raise StaleWeightsError(problem)
        self.counters.generates += 1

    def finish(self, driver: EngineDriver, push_due: bool | None, final: bool = False) -> SleepDecision:
        """Put the engine to sleep after a generate, at the level the policy chooses (none with `off`).

        Args:
            driver ([`EngineDriver`]):
                The engine.
            push_due (`bool` or `None`):
                Whether an optimizer step (so a push) comes before the next generate; None when the caller
                cannot tell, which `auto` reads as no (a wrong guess costs time, never correctness).
            final (`bool`, *optional*, defaults to `False`):
                No generate follows: the sleep only frees memory for the rest of training.

        Returns:
            [`SleepDecision`]: the level (0 for none), the reason, and `auto`'s modeled cycle costs.
        """
        decision = choose_sleep_level(self.policy, push_due, self.costs, final)
        if decision.level:
            self._sleep(driver, decision.level, decision.reason)
        else:
            log.debug("sleep-policy: %s", decision.reason)
        return decision

    # -- internals -----------------------------------------------------------------------
    def _sleep(self, driver: EngineDriver, level: int, reason: str) -> None:
        seconds = self._timed(lambda: driver.sleep(level))
        self.state.kv_cache_awake = False
        if level == 1:
            self.state.residence = Residence.CPU
        else:
            self.state.residence = Residence.DISCARDED
            self.state.held_version = None
        self._last_level = level
        self.counters.sleeps[level] += 1
        self.counters.sleep_seconds += seconds
        self.costs.record(CostKind.SLEEP1 if level == 1 else CostKind.SLEEP2, seconds)
        log.info("sleep-policy: sleep level %d %.4fs (%s)", level, seconds, reason)

    def _timed(self, fn: Callable[[], object]) -> float:
        start = self._clock()
        fn()
        return self._agree(self._clock() - start)
