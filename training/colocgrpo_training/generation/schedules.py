"""Training schedules as event sequences: when generates, optimizer steps, evaluations,
checkpoint saves and restarts happen in a TRL 1.16 GRPO run.

Pure Python. The CPU property test drives the sleep-policy engine against a fake engine
with these schedules, and the GPU integrity suite (tests/gpu/) drives real vLLM with the
very same ones.

How TRL 1.16 schedules generation (grpo_trainer.py `_prepare_inputs`): its micro-step
counter `_step` counts `training_step` calls; it generates when `_step % (steps_per_generation
* num_iterations) == 0` (or when nothing is buffered, e.g. after a resume) and serves the
buffered slices otherwise. The HF Trainer steps the optimizer after every
`gradient_accumulation_steps` micro-steps (or at an epoch's end with the remainder), then
may evaluate (one generate per eval batch) and save.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Literal


@dataclass(frozen=True)
class Generate:
    mode: Literal["train", "eval"]
    # Exact look-ahead: does an optimizer step (or a restart) happen before the next generate?
    push_due_before_next: bool = False
    # No generate follows in this process (the last one of the run, or before a restart).
    last_in_process: bool = False


@dataclass(frozen=True)
class MicroStep:
    """One `training_step` (forward + backward): weights unchanged."""


@dataclass(frozen=True)
class OptimizerStep:
    """The trainer's weights change; its version (global step) increases by one."""


@dataclass(frozen=True)
class Save:
    """A checkpoint of the current weights (global step)."""


@dataclass(frozen=True)
class Restart:
    """The process restarts and resumes from the newest save: fresh engine, trainer weights
    and global step restored to that save's."""


Event = Generate | MicroStep | OptimizerStep | Save | Restart


@dataclass(frozen=True)
class ScheduleParams:
    gradient_accumulation_steps: int = 1
    steps_per_generation: int = 1
    num_iterations: int = 1
    max_steps: int = 4
    # Generate calls per generation batch (multi-turn tool use calls vLLM once per turn).
    turns_per_generation: int = 1
    eval_every: int = 0  # optimizer steps; 0: no evaluation
    eval_batches: int = 1
    save_every: int = 0  # optimizer steps; 0: no checkpoints
    # Restart once after this optimizer step (resuming from the newest save); needs save_every.
    restart_after_step: int | None = None
    # Micro-batches per epoch; a remainder smaller than gradient_accumulation_steps still steps.
    micro_batches_per_epoch: int | None = None


@dataclass
class Schedule:
    params: ScheduleParams
    events: list[Event] = field(default_factory=list)

    @property
    def generates(self) -> list[Generate]:
        return [e for e in self.events if isinstance(e, Generate)]

    def describe(self) -> str:
        short = {Generate: "G", MicroStep: "m", OptimizerStep: "S", Save: "s", Restart: "R"}
        out = []
        for e in self.events:
            c = short[type(e)]
            if isinstance(e, Generate):
                c = ("G" if e.mode == "train" else "E") + ("*" if e.push_due_before_next else "")
                c += "$" if e.last_in_process else ""
            out.append(c)
        return " ".join(out)


def build_schedule(p: ScheduleParams) -> Schedule:
    """Simulate TRL's training loop for `p` and return its event sequence."""
    for name in ("gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_steps"):
        if getattr(p, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(p, name)}")
    if p.restart_after_step is not None and not p.save_every:
        raise ValueError("restart_after_step needs save_every (a restart resumes from a save)")
    events: list[Event] = []
    generate_every = p.steps_per_generation * p.num_iterations
    global_step = 0
    micro = 0  # TRL's self._step: reset by a restart (a new process)
    buffered = False
    micro_in_epoch = 0
    restarted = False
    last_save = 0

    def generation_batch(mode: Literal["train", "eval"]) -> None:
        events.extend(Generate(mode) for _ in range(p.turns_per_generation))

    while global_step < p.max_steps:
        window = p.gradient_accumulation_steps
        if p.micro_batches_per_epoch is not None:
            window = min(window, p.micro_batches_per_epoch - micro_in_epoch)
        for _ in range(window):
            if micro % generate_every == 0 or not buffered:
                generation_batch("train")
                buffered = True
            events.append(MicroStep())
            micro += 1
            micro_in_epoch += 1
        if p.micro_batches_per_epoch is not None and micro_in_epoch >= p.micro_batches_per_epoch:
            micro_in_epoch = 0
        events.append(OptimizerStep())
        global_step += 1
        if p.eval_every and global_step % p.eval_every == 0:
            for _ in range(p.eval_batches):
                generation_batch("eval")
        if p.save_every and global_step % p.save_every == 0:
            events.append(Save())
            last_save = global_step
        if p.restart_after_step is not None and not restarted and global_step == p.restart_after_step:
            events.append(Restart())
            restarted = True
            global_step = last_save
            micro = 0
            buffered = False
            micro_in_epoch = 0
    return Schedule(p, _annotate_push_due(events))


def _annotate_push_due(events: list[Event]) -> list[Event]:
    """Set each Generate's exact look-ahead flag (walks backwards once)."""
    out = list(events)
    step_ahead = False  # a step/restart between this point and the next generate (or the end)
    last = True  # no generate between this point and the end of the process
    for i in range(len(out) - 1, -1, -1):
        e = out[i]
        if isinstance(e, Restart):
            step_ahead = last = True
        elif isinstance(e, OptimizerStep):
            step_ahead = True
        elif isinstance(e, Generate):
            out[i] = replace(e, push_due_before_next=step_ahead, last_in_process=last)
            step_ahead = last = False
    return out


@dataclass(frozen=True)
class NextGenerate:
    push_due: bool  # an optimizer step happens before the next generate
    final: bool  # no generate follows (training ends first)


def predict_next_generate(
    micro_step: int,
    global_step: int,
    max_steps: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    num_iterations: int,
    mode: Literal["train", "eval"] = "train",
) -> NextGenerate:
    """What the trainer can know online at a generate done at TRL micro-step `micro_step`
    (its `_step`) and optimizer step `global_step`.

    The micro-steps run before the next training generate are [micro_step, micro_step + S·I);
    the optimizer steps after micro-step m when (m + 1) % G == 0. Evaluation batches follow
    each other without a step in between, so eval generates predict "no push due". Not
    foreseen: epoch-end remainder steps, and evaluation right after a step. A wrong prediction
    costs time, never correctness (the engine record decides pushes, not the prediction).
    """
    if mode == "eval":
        return NextGenerate(push_due=False, final=False)
    span = steps_per_generation * num_iterations
    g = gradient_accumulation_steps
    steps_before_next = (micro_step + span) // g - micro_step // g
    return NextGenerate(push_due=steps_before_next > 0, final=global_step + steps_before_next >= max_steps)


def random_params(rng: random.Random, max_steps: int = 6) -> ScheduleParams:
    """A random but small schedule (used by the GPU suite; the CPU test uses hypothesis)."""
    save_every = rng.choice([0, 0, 2, 3])
    return ScheduleParams(
        gradient_accumulation_steps=rng.randint(1, 4),
        steps_per_generation=rng.randint(1, 4),
        num_iterations=rng.randint(1, 2),
        max_steps=max_steps,
        turns_per_generation=rng.choice([1, 1, 2]),
        eval_every=rng.choice([0, 0, 2, 3]),
        eval_batches=rng.randint(1, 2),
        save_every=save_every,
        restart_after_step=(rng.randint(save_every, max_steps - 1) if save_every and save_every < max_steps else None),
        micro_batches_per_epoch=rng.choice([None, None, 5, 7]),
    )
