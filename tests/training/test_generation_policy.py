"""The sleep-policy engine against the fake vLLM engine: fixed sequences per policy.

Pure Python (no torch): runs in any venv.
"""

from __future__ import annotations

import pytest

from colocgrpo_training.config import SleepPolicy
from colocgrpo_training.generation.policy import (
    CostKind,
    CostModel,
    EngineOrderError,
    EngineState,
    RedundantPushError,
    Residence,
    SleepController,
    StaleWeightsError,
    choose_sleep_level,
    plan_wake,
)
from support.fake_engine import (
    FakeClock,
    FakeEngineDriver,
    FakeTrainerModel,
    FakeVLLM,
    completion_for,
)

COSTS = {CostKind.SLEEP1: 0.3, CostKind.WAKE1: 0.3, CostKind.SLEEP2: 0.01, CostKind.WAKE2: 0.01, CostKind.PUSH: 0.1}
PROMPTS = ["a", "b"]


def make(policy: str, costs: dict[CostKind, float] = COSTS):
    clock = FakeClock()
    trainer = FakeTrainerModel.build(seed=1)
    engine = FakeVLLM(trainer.snapshot(), costs, clock)
    driver = FakeEngineDriver(engine, trainer, bucket_bytes=4, push_cost=costs[CostKind.PUSH], clock=clock)
    model = CostModel.fixed(**{k.value: v for k, v in costs.items()})
    ctl = SleepController(policy, model, clock=clock)
    return clock, trainer, engine, driver, ctl


def generate(ctl, driver, engine, trainer, version, push_due):
    plan = ctl.prepare(driver, version)
    ctl.check_ready(version)
    out = engine.generate(PROMPTS)
    assert out == [completion_for(trainer.params, p) for p in PROMPTS]
    ctl.finish(driver, push_due)
    return plan


def test_plan_order_is_weights_push_kv():
    state = EngineState(held_version=None, residence=Residence.DISCARDED, kv_cache_awake=False)
    assert plan_wake(state, 3).steps == ("wake_weights", "push", "wake_kv_cache")
    state = EngineState(held_version=3, residence=Residence.CPU, kv_cache_awake=False)
    assert plan_wake(state, 3).steps == ("wake_weights", "wake_kv_cache")
    assert plan_wake(state, 4).steps == ("wake_weights", "push", "wake_kv_cache")
    assert plan_wake(EngineState(held_version=4), 4).steps == ()


@pytest.mark.parametrize("policy", ["off", "level1", "level2", "auto"])
def test_every_policy_generates_fresh_weights_across_steps(policy):
    _clock, trainer, engine, driver, ctl = make(policy)
    ctl.initial_sleep(driver)
    for version in range(4):
        generate(ctl, driver, engine, trainer, version, push_due=False)  # two generates per step
        generate(ctl, driver, engine, trainer, version, push_due=True)
        trainer.optimizer_step()
    pushes = ctl.counters.pushes
    if policy in ("off", "level1"):
        assert pushes == 4  # exactly once per weight version
    if policy == "level2":
        assert pushes == 8  # once per generate
    if policy == "auto":
        # No-step cycles: level-1 round trip 0.6 s > level-2 0.02 s + push 0.1 s, so level 2.
        assert pushes == 8
        assert ctl.counters.sleeps == {1: 0, 2: 9}


def test_auto_prefers_level1_when_push_is_expensive():
    costs = dict(COSTS, **{CostKind.PUSH: 5.0})
    _clock, trainer, engine, driver, ctl = make("auto", costs)
    ctl.initial_sleep(driver)
    generate(ctl, driver, engine, trainer, 0, push_due=False)
    generate(ctl, driver, engine, trainer, 0, push_due=True)
    assert ctl.counters.sleeps == {1: 1, 2: 2}
    assert ctl.counters.pushes == 1  # the level-1 round trip kept version 0: no second push


def test_level2_wake_without_push_is_caught_by_the_fake_engine():
    """The seed's bug: the fake engine really loses level-2 weights."""
    _clock, trainer, engine, _driver, _ctl = make("level2")
    engine.sleep(2)
    engine.wake_up()
    assert engine.generate(PROMPTS) != [completion_for(trainer.params, p) for p in PROMPTS]


def test_partial_push_gives_wrong_output():
    _clock, trainer, engine, _driver, _ctl = make("level2")
    engine.sleep(2)
    engine.wake_up(tags=["weights"])
    engine.load_weights(list(trainer.named_parameters())[:3])
    engine.wake_up(tags=["kv_cache"])
    assert engine.generate(PROMPTS) != [completion_for(trainer.params, p) for p in PROMPTS]


def test_kv_cache_before_weights_fails():
    _clock, _trainer, engine, _driver, _ctl = make("level2")
    engine.sleep(2)
    with pytest.raises(EngineOrderError):
        engine.wake_up(tags=["kv_cache"])


def test_invariant_raises_on_stale_weights(caplog):
    _clock, _trainer, _engine, driver, ctl = make("off")
    ctl.prepare(driver, 0)
    ctl.check_ready(0)
    with pytest.raises(StaleWeightsError, match="holds weights version 0, trainer is at 1"):
        ctl.check_ready(1)
    assert "invariant violated" in caplog.text


def test_invariant_raises_when_asleep():
    _clock, _trainer, _engine, driver, ctl = make("level1")
    ctl.prepare(driver, 0)
    ctl.finish(driver, push_due=False)
    with pytest.raises(StaleWeightsError, match="not on the GPU"):
        ctl.check_ready(0)


def test_redundant_push_refused():
    _clock, _trainer, _engine, driver, ctl = make("off")
    ctl.prepare(driver, 0)
    with pytest.raises(RedundantPushError):
        ctl.push(driver, 0)
    assert ctl.counters.pushes == 1


def test_invalidate_forces_a_push():
    _clock, trainer, engine, driver, ctl = make("off")
    generate(ctl, driver, engine, trainer, 5, push_due=False)
    trainer.optimizer_step()  # e.g. a checkpoint was loaded at the same global step
    ctl.invalidate("checkpoint loaded")
    generate(ctl, driver, engine, trainer, 5, push_due=False)
    assert ctl.counters.pushes == 2


def test_cost_model_priors_then_ewma():
    model = CostModel.from_weight_bytes(2 * 1024**3)
    assert model.seconds[CostKind.WAKE1] == pytest.approx(2 * 1024**3 / 16.5e9)
    model.record(CostKind.PUSH, 1.0)
    assert model.seconds[CostKind.PUSH] == 1.0  # first measurement replaces the prior
    model.record(CostKind.PUSH, 2.0)
    assert model.seconds[CostKind.PUSH] == pytest.approx(0.7 * 1.0 + 0.3 * 2.0)


def test_level1_priors_move_one_tp_shard_and_the_push_every_byte():
    # Under TP each rank's vLLM holds 1/tp of the weights: that is what a level-1 sleep or wake
    # moves over its host link. Every rank gathers and loads the whole model in a push.
    whole, tp4 = CostModel.from_weight_bytes(8 * 1024**3), CostModel.from_weight_bytes(8 * 1024**3, 4)
    for kind in (CostKind.SLEEP1, CostKind.WAKE1):
        assert tp4.seconds[kind] == pytest.approx(whole.seconds[kind] / 4)
    assert tp4.seconds[CostKind.PUSH] == whole.seconds[CostKind.PUSH]
    assert tp4.seconds[CostKind.SLEEP2] == whole.seconds[CostKind.SLEEP2]


def test_first_level1_sleep_is_a_one_off_not_the_steady_cost():
    model = CostModel.from_weight_bytes(14 * 1024**3)  # ~7B in bf16
    prior = model.seconds[CostKind.SLEEP1]
    model.record(CostKind.SLEEP1, 6.5)  # pinned host buffers allocated (measured at 7.18B)
    assert model.one_off[CostKind.SLEEP1] == 6.5
    assert model.seconds[CostKind.SLEEP1] == prior
    model.record(CostKind.SLEEP1, 0.30)  # the steady cost replaces the prior
    assert model.seconds[CostKind.SLEEP1] == 0.30
    model.record(CostKind.SLEEP1, 0.40)
    assert model.seconds[CostKind.SLEEP1] == pytest.approx(0.7 * 0.30 + 0.3 * 0.40)
    model.record(CostKind.SLEEP2, 0.05)  # other kinds: the first sample counts
    assert model.seconds[CostKind.SLEEP2] == 0.05 and CostKind.SLEEP2 not in model.one_off


def test_auto_tries_level1_again_after_its_slow_first_sleep():
    # A slow push (many nodes) makes a level-1 round trip the cheaper one, unless the first
    # level-1 sleep's one-off were taken for its steady cost.
    model = CostModel.from_weight_bytes(1024**3)
    model.record(CostKind.PUSH, 10.0)
    assert choose_sleep_level(SleepPolicy.AUTO, False, model).level == 1
    model.record(CostKind.SLEEP1, 20.0)
    assert choose_sleep_level(SleepPolicy.AUTO, False, model).level == 1


def test_auto_decision_follows_measured_costs():
    model = CostModel.from_weight_bytes(1024**3)
    assert choose_sleep_level(SleepPolicy.AUTO, False, model).level == 2
    model.record(CostKind.PUSH, 10.0)  # a slow push (many nodes): a level-1 round trip is cheaper
    assert choose_sleep_level(SleepPolicy.AUTO, False, model).level == 1
    assert choose_sleep_level(SleepPolicy.AUTO, True, model).level == 2  # push due anyway
    assert choose_sleep_level(SleepPolicy.OFF, True, model).level == 0


def test_agree_hook_sees_every_measurement():
    seen = []

    def agree(x: float) -> float:
        seen.append(x)
        return 1.0  # e.g. the max over ranks

    _clock, trainer, engine, driver, ctl = make("level2")
    ctl._agree = agree
    ctl.initial_sleep(driver)
    generate(ctl, driver, engine, trainer, 0, push_due=False)
    assert len(seen) == 5  # sleep, wake weights, push, wake kv, sleep
    assert ctl.costs.seconds[CostKind.PUSH] == COSTS[CostKind.PUSH]  # fixed model ignores them
