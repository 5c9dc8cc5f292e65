"""A CPU stand-in for a colocated vLLM engine and a trainer model, for tests.

It reproduces the behaviour that matters for the sleep policy (docs/sleep-policy.md, "What vLLM's sleep mode does"):
- level-1 sleep keeps a valid copy of the weights in host memory, wake restores it;
- level-2 sleep loses the weights: after waking, memory holds garbage until a full push;
- waking the KV cache while the weights sleep is an error (a CUDA error in vLLM);
- generate needs weights and KV cache awake; its output is a deterministic function of the
  weights it holds, so a test detects stale, partial or garbage weights by comparing with
  the same function of the trainer's weights.

The engine knows nothing about versions: the checks compare actual values.
Each operation advances a modeled clock by a fixed cost, which the controller reads as
its measured time, so cost claims are checked under a known cost model.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from colocgrpo_training.generation.buckets import plan_buckets
from colocgrpo_training.generation.policy import CostKind, EngineOrderError

Weights = dict[str, tuple[float, ...]]


def completion_for(weights: Weights, prompt: str) -> str:
    """The fake model's greedy completion: a digest of the prompt and every weight."""
    h = hashlib.sha256(prompt.encode())
    for name in sorted(weights):
        h.update(name.encode())
        h.update(repr(weights[name]).encode())
    return h.hexdigest()[:16]


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeTrainerModel:
    """Named parameters; an optimizer step changes every one of them."""

    params: Weights
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @classmethod
    def build(cls, n_params: int = 6, seed: int = 0) -> FakeTrainerModel:
        rng = random.Random(seed)
        params = {f"layers.{i}.weight": tuple(rng.random() for _ in range(1 + i % 3)) for i in range(n_params)}
        return cls(params, rng)

    def optimizer_step(self) -> None:
        self.params = {k: tuple(x + self.rng.uniform(0.1, 1.0) for x in v) for k, v in self.params.items()}

    def snapshot(self) -> Weights:
        return dict(self.params)

    def load(self, weights: Weights) -> None:
        self.params = dict(weights)

    def named_parameters(self) -> Iterator[tuple[str, tuple[float, ...]]]:
        return iter(self.params.items())


class FakeVLLM:
    """The engine: `sleep`, `wake_up(tags)`, `load_weights`, `generate`, like vLLM's LLM."""

    def __init__(self, base: Weights, costs: dict[CostKind, float], clock: FakeClock, seed: int = 0) -> None:
        self._gpu: Weights | None = dict(base)
        self._host: Weights | None = None
        self._level = 0
        self.weights_awake = True
        self.kv_awake = True
        self._costs = costs
        self._clock = clock
        self._rng = random.Random(seed)
        self.load_weights_calls = 0

    def sleep(self, level: int) -> None:
        if not (self.weights_awake and self.kv_awake):
            raise EngineOrderError("sleep called on a sleeping engine")
        if level == 1:
            self._host, self._gpu = self._gpu, None
        elif level == 2:
            self._host = self._gpu = None
        else:
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self._level = level
        self.weights_awake = self.kv_awake = False
        self._clock.now += self._costs[CostKind.SLEEP1 if level == 1 else CostKind.SLEEP2]

    def wake_up(self, tags: Iterable[str] | None = None) -> None:
        tags = list(tags) if tags is not None else ["weights", "kv_cache"]
        for tag in tags:
            if tag == "weights" and not self.weights_awake:
                if self._level == 1:
                    assert self._host is not None
                    self._gpu = dict(self._host)
                    self._clock.now += self._costs[CostKind.WAKE1]
                else:
                    # Re-mapped memory with whatever bytes were there: garbage of the right shape.
                    self._gpu = {f"garbage.{i}": (self._rng.random(),) for i in range(3)}
                    self._clock.now += self._costs[CostKind.WAKE2]
                self.weights_awake = True
            elif tag == "kv_cache" and not self.kv_awake:
                if not self.weights_awake:
                    raise EngineOrderError("KV cache woken before the weights (vLLM: CUDA error)")
                self.kv_awake = True

    def load_weights(self, items: Iterable[tuple[str, tuple[float, ...]]]) -> None:
        if not self.weights_awake:
            raise EngineOrderError("load_weights into sleeping weights")
        assert self._gpu is not None
        self.load_weights_calls += 1
        for name, value in items:
            # Garbage entries are overwritten by the first real push of a complete model.
            self._gpu = {k: v for k, v in self._gpu.items() if not k.startswith("garbage.")}
            self._gpu[name] = tuple(value)

    def generate(self, prompts: list[str]) -> list[str]:
        if not (self.weights_awake and self.kv_awake):
            raise EngineOrderError("generate on a sleeping engine (vLLM would never schedule it)")
        assert self._gpu is not None
        return [completion_for(self._gpu, p) for p in prompts]


class FakeEngineDriver:
    """Adapts FakeVLLM + FakeTrainerModel to the controller's `EngineDriver` protocol,
    pushing in byte-budgeted buckets like `ColocatedVLLM` does."""

    BYTES_PER_VALUE = 2  # pretend bf16

    def __init__(
        self,
        engine: FakeVLLM,
        trainer: FakeTrainerModel,
        bucket_bytes: int = 8,
        push_cost: float = 0.0,
        clock: FakeClock | None = None,
    ) -> None:
        self.engine = engine
        self.trainer = trainer
        self.bucket_bytes = bucket_bytes
        self._push_cost = push_cost
        self._clock = clock

    def wake_weights(self) -> None:
        self.engine.wake_up(tags=["weights"])

    def wake_kv_cache(self) -> None:
        self.engine.wake_up(tags=["kv_cache"])

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def push_weights(self) -> int:
        named = list(self.trainer.named_parameters())
        sizes = [(name, len(v) * self.BYTES_PER_VALUE) for name, v in named]
        total = 0
        for bucket in plan_buckets(sizes, self.bucket_bytes):
            self.engine.load_weights((named[i][0], named[i][1]) for i in bucket)
            total += sum(sizes[i][1] for i in bucket)
        if self._clock is not None:
            self._clock.now += self._push_cost
        return total
