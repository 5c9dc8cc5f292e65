"""bench/step_sections.py: sections summed per step, nested sections apart, the remainders."""

from __future__ import annotations

import time

import pytest

from bench.step_sections import SectionTimer


class Trainer:
    """The methods SectionTimer wraps, each sleeping a known time (TRL's nesting: generation inside
    training_step, the old log-probs inside generation, the training forward inside the loss)."""

    def __init__(self, clock: list[float], grad: list[bool]) -> None:
        self.clock = clock
        self.grad = grad
        self.vllm_generation = Engine(clock)

    def _tick(self, seconds: float) -> None:
        self.clock[0] += seconds

    def _get_per_token_logps_and_entropies(self) -> None:
        self._tick(0.5 if self.grad[0] else 0.25)

    def _calculate_rewards(self) -> None:
        self._tick(0.125)

    def _generate_and_score_completions(self) -> None:
        self.vllm_generation.generate()
        self._calculate_rewards()
        self.grad[0] = False
        self._get_per_token_logps_and_entropies()
        self.grad[0] = True

    def _prepare_inputs(self, generate: bool) -> None:
        if generate:
            self._generate_and_score_completions()
            self._tick(0.25)  # the split, and old log-probs computed after it

    def training_step(self, generate: bool, deepspeed: Engine) -> None:
        self._prepare_inputs(generate)
        self._get_per_token_logps_and_entropies()
        self._tick(0.0625)  # the loss itself
        deepspeed.backward()
        deepspeed.step()


class Engine:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def generate(self) -> None:
        self.clock[0] += 1.0

    def backward(self) -> None:
        self.clock[0] += 2.0

    def step(self) -> None:
        self.clock[0] += 0.75


@pytest.fixture
def fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    return clock


def test_sections_are_summed_per_step_and_split_by_autograd(fake_clock):
    grad = [True]
    trainer = Trainer(fake_clock, grad)
    synced: list[int] = []
    timer = SectionTimer(lambda: synced.append(1), lambda: grad[0])
    timer.wrap_trainer(trainer)
    deepspeed = Engine(fake_clock)
    timer.wrap_engine(deepspeed)

    for generate in (True, False):
        start = fake_clock[0]
        trainer.training_step(generate, deepspeed)
        fake_clock[0] += 0.5  # the Trainer's loop around it
        timer.close_step(fake_clock[0] - start)

    gen, train = timer.steps
    assert gen["vllm_generate"] == 1.0 and gen["rewards"] == 0.125 and gen["old_logps"] == 0.25
    assert gen["generate_and_score"] == 1.375 and gen["prepare_inputs"] == 1.625
    assert gen["train_logps"] == 0.5 and gen["training_step"] == 4.9375
    assert gen["backward"] == 2.0 and gen["optimizer_step"] == 0.75
    assert gen["in_step_other"] == 0.0625  # the loss: what no inner section covers
    assert gen["step"] == 5.4375 and gen["unattributed"] == 0.5
    assert "generate_and_score" not in train and "old_logps" not in train and train["training_step"] == 3.3125
    assert train["prepare_inputs"] == 0.0  # a buffered micro-batch
    assert synced, "every section edge waits for the device"

    summary = timer.summary()
    assert summary["count"] == {"gen": 1, "train": 1}
    assert summary["gen_steps"]["vllm_generate"] == 1.0 and summary["train_steps"]["train_logps"] == 0.5
    assert timer.summary(skip=1)["count"] == {"gen": 0, "train": 1}


def test_a_trainer_without_an_engine_or_a_method_is_wrapped_as_far_as_it_goes(fake_clock):
    class Plain:
        def training_step(self) -> None:
            fake_clock[0] += 1.0

    plain = Plain()
    timer = SectionTimer(None, lambda: True)
    timer.wrap_trainer(plain)
    plain.training_step()
    timer.close_step(1.0)
    assert timer.steps == [{"training_step": 1.0, "in_step_other": 1.0, "step": 1.0, "unattributed": 0.0}]
    assert timer.summary()["gen_steps"] == {}
