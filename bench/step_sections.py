"""Where a GRPO step's wall time goes, by the trainer's own methods (`bench.grpo --section-times`).

torch.profiler's op tables (`--profile-steps`) say which kernels and Python ops cost; they do not say which
part of the trainer called them. This wraps a handful of methods on one trainer *instance* (nothing global,
nothing in the trainer's code) and sums each one's wall time per optimizer step:

- `prepare_inputs`: TRL's `_prepare_inputs` (a generation step's generation, scoring and split; our trainer's
  old log-probs of the micro-batches trained after an optimizer step);
- `generate_and_score`: TRL's `_generate_and_score_completions`, inside it;
- `vllm_generate`: the engine's `generate` (ours: wake, push, generate, sleep; TRL's: its generate call);
- `old_logps`: `_get_per_token_logps_and_entropies` without autograd (the old and reference log-probs);
- `train_logps`: the same with autograd (the training forward inside `compute_loss`);
- `rewards`: `_calculate_rewards`;
- `backward` and `optimizer_step`: the DeepSpeed engine's `backward` and `step` (bound when training begins);
- `training_step`: the Trainer's `training_step`: TRL prepares its inputs there (so a generation step's
  `prepare_inputs` falls inside it), then the loss's forward, the backward and, under DeepSpeed, the
  optimizer step at the end of the accumulation.

Sections nest (`vllm_generate` inside `generate_and_score` inside `prepare_inputs`, all of them inside
`training_step`): each is
timed on its own, so they do not add up to the step; `close_step` adds the two remainders that do
(`in_step_other`: training_step minus the sections inside it at its top level; `unattributed`: the step
minus training_step — the Trainer's loop, callbacks, logging). With `sync` (CUDA), every section boundary waits for the
GPU, so a section is charged for its own kernels: the run's step times are then not comparable with an
unsynchronised run's, and the bench reports them apart.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

TRAINER_METHODS = {
    "_prepare_inputs": "prepare_inputs",
    "_generate_and_score_completions": "generate_and_score",
    "_calculate_rewards": "rewards",
    "training_step": "training_step",
}
LOGPS_METHOD = "_get_per_token_logps_and_entropies"
ENGINE_METHODS = {"backward": "backward", "step": "optimizer_step"}


class SectionTimer:
    """Sums wall seconds per named section; `close_step()` files the sums as one step's row.

    Args:
        sync: called at both edges of every section (`torch.cuda.synchronize` on CUDA), or None.
        grad_enabled: tells whether autograd records right now (`torch.is_grad_enabled`), to split the
            log-prob forwards into `old_logps` and `train_logps`.
    """

    def __init__(self, sync: Callable[[], None] | None, grad_enabled: Callable[[], bool]) -> None:
        self.sync = sync
        self.grad_enabled = grad_enabled
        self.current: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.steps: list[dict[str, float]] = []

    def wrap(self, owner: Any, method: str, section: str | Callable[[], str]) -> None:
        """Replace `owner.method` (an instance attribute, shadowing the class's) by a timed call."""
        original = getattr(owner, method)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = section() if callable(section) else section
            if self.sync is not None:
                self.sync()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.sync is not None:
                    self.sync()
                self.current[name] += time.perf_counter() - start
                self.calls[name] += 1

        setattr(owner, method, timed)

    def wrap_trainer(self, trainer: Any) -> None:
        """The trainer's own sections (those it has) and its engine's `generate`."""
        for method, section in TRAINER_METHODS.items():
            if hasattr(trainer, method):
                self.wrap(trainer, method, section)
        if hasattr(trainer, LOGPS_METHOD):
            self.wrap(trainer, LOGPS_METHOD, lambda: "train_logps" if self.grad_enabled() else "old_logps")
        engine = getattr(trainer, "vllm_generation", None)
        if engine is not None and hasattr(engine, "generate"):
            self.wrap(engine, "generate", "vllm_generate")

    def wrap_engine(self, engine: Any) -> None:
        """The DeepSpeed engine's `backward` and `step` (it exists once training has begun)."""
        for method, section in ENGINE_METHODS.items():
            if hasattr(engine, method):
                self.wrap(engine, method, section)

    def close_step(self, step_seconds: float) -> None:
        """File this step's sums, with the whole step's wall time as `step` and the two remainders."""
        row = dict(self.current)
        inside = sum(row.get(k, 0.0) for k in ("prepare_inputs", "train_logps", "backward", "optimizer_step"))
        row["in_step_other"] = row.get("training_step", 0.0) - inside
        row["step"] = step_seconds
        row["unattributed"] = step_seconds - row.get("training_step", 0.0)
        self.steps.append(row)
        self.current = defaultdict(float)

    def summary(self, skip: int = 0) -> dict[str, dict[str, float]]:
        """Per section, over the steps after the first `skip`: the mean per step, and apart for steps
        that generated (`gen_steps`) and those that did not (`train_steps`)."""
        rows = self.steps[skip:]
        gen = [r for r in rows if "generate_and_score" in r]
        train = [r for r in rows if "generate_and_score" not in r]

        def means(group: list[dict[str, float]]) -> dict[str, float]:
            names = sorted({k for r in group for k in r})
            return {k: sum(r.get(k, 0.0) for r in group) / len(group) for k in names} if group else {}

        return {"gen_steps": means(gen), "train_steps": means(train), "count": {"gen": len(gen), "train": len(train)}}
