"""Built-in rewards against hand cases (open-r1 semantics) and user-reward resolution."""

from __future__ import annotations

import pytest

from colocgrpo_training.config import RewardSettings
from colocgrpo_training.failures import REWARD_FUNCTION_ERROR, RewardFunctionError, classify
from colocgrpo_training.rewards import RewardError, resolve_reward, resolve_rewards
from colocgrpo_training.rewards.builtin import accuracy_reward, format_reward, last_number_reward, tag_count_reward

pytestmark = pytest.mark.trainer


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_accuracy_rewards_matching_boxed_answer():
    completions = [chat(r"So the answer is $\boxed{5}$."), chat(r"The result is $\boxed{6}$."), chat("5")]
    assert accuracy_reward(completions, solution=["$5$", "$5$", "$5$"]) == [1.0, 0.0, 0.0]


def test_accuracy_compares_mathematically_not_textually():
    completions = [chat(r"$\boxed{\frac{1}{2}}$"), chat(r"$\boxed{0.5}$"), chat(r"$\boxed{\frac{2}{4}}$")]
    assert accuracy_reward(completions, solution=[r"$\frac{1}{2}$"] * 3) == [1.0, 1.0, 1.0]


def test_accuracy_skips_unparsable_gold_with_none():
    rewards = accuracy_reward([chat(r"$\boxed{5}$"), chat(r"$\boxed{5}$")], solution=["no answer here", "$5$"])
    assert rewards == [None, 1.0]


def test_accuracy_accepts_plain_string_completions():
    assert accuracy_reward([r"$\boxed{12}$"], solution=["$12$"]) == [1.0]


def test_format_requires_exact_think_answer_layout():
    good = "<think>\nadd them\n</think>\n<answer>\n5\n</answer>"
    assert format_reward([chat(good)]) == [1.0]
    assert format_reward([chat("preamble " + good)]) == [0.0]
    assert format_reward([chat("<think>add</think><answer>5</answer>")]) == [0.0]
    assert format_reward([chat("<think>\nmulti\nline\n</think>\n<answer>\n5\n</answer>")]) == [1.0]


def test_tag_count_gives_a_quarter_per_tag_seen_once():
    assert tag_count_reward([chat("<think>\nx\n</think>\n<answer>\n5\n</answer>")]) == [1.0]
    assert tag_count_reward([chat("<think>\nx\n</think>\n")]) == [0.5]
    assert tag_count_reward([chat("<think>\n<think>\n")]) == [0.0]
    assert tag_count_reward([chat("nothing")]) == [0.0]


def test_user_reward_resolved_from_reward_modules_dir(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def length_reward(completions, **kwargs):\n    return [float(len(c[0]['content'])) for c in completions]\n"
    )
    functions, weights = resolve_rewards(
        [RewardSettings(function="format", weight=0.5), RewardSettings(function="my_rewards:length_reward", weight=2)],
        reward_modules_dir=str(tmp_path),
    )
    assert functions[0].__wrapped__ is format_reward  # guarded: what it raises names it
    assert functions[1].__name__ == "length_reward"
    assert functions[1]([chat("abc")]) == [3.0]
    assert weights == [0.5, 2.0]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("accurracy", "neither a built-in reward"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("json:no_such_function", "has no attribute 'no_such_function'"),
        ("json:__doc__", "is not callable"),
        (":f", "must look like 'module:function'"),
    ],
)
def test_bad_reward_entries_are_named(spec, fragment):
    with pytest.raises(RewardError) as err:
        resolve_rewards([RewardSettings(function="format"), RewardSettings(function=spec)])
    assert "rewards[1].function" in str(err.value)
    assert fragment in str(err.value)


def test_last_number_scores_the_last_number_of_a_sentence_answer():
    completions = [chat("10 + 4 = 14."), chat("10 + 4 = 14, not 15"), chat("The answer is fourteen."), chat("14.0")]
    assert last_number_reward(completions, solution=["14"] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert last_number_reward(["-3"], solution=[" -3 "]) == [1.0]


def test_last_number_skips_a_gold_answer_that_is_not_a_number():
    assert last_number_reward([chat("x = 5"), chat("5")], solution=["$\\frac{1}{2}$", "5"]) == [None, 1.0]


def test_resolve_reward_returns_builtin_by_name():
    assert resolve_reward("tag_count") is tag_count_reward
    assert resolve_reward("last_number") is last_number_reward


USER_REWARDS = """
import asyncio


def raises(completions, **kwargs):
    raise ValueError("the judge said no")


async def raises_later(completions, **kwargs):
    await asyncio.sleep(0)
    raise KeyError("score")


def too_few(completions, **kwargs):
    return [1.0]


def generated(completions, **kwargs):
    return (float(i) for i, _ in enumerate(completions))


class Judge:
    def __call__(self, completions, **kwargs):
        raise RuntimeError("judge down")


judge = Judge()
"""


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "user_rewards_mod.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def resolve(name: str):
        functions, _ = resolve_rewards(
            [RewardSettings(function="format"), RewardSettings(function=f"user_rewards_mod:{name}")]
        )
        return functions[1]

    return resolve


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", "reward function user_rewards_mod:raises (rewards[1]) raised ValueError: the judge said no"),
        ("too_few", "reward function user_rewards_mod:too_few (rewards[1]) returned 1 rewards for 2 completions"),
        ("judge", "reward function user_rewards_mod:Judge (rewards[1]) raised RuntimeError: judge down"),
    ],
)
def test_a_failing_reward_function_is_named_with_its_module_and_entry(user_rewards, name, message):
    function = user_rewards(name)
    with pytest.raises(RewardFunctionError) as err:
        function(prompts=["p", "q"], completions=[chat("a"), chat("b")])
    assert str(err.value) == message
    failure = classify(err.value)
    assert (failure.reason, failure.message, failure.exit_code) == (REWARD_FUNCTION_ERROR, message, 1)


def test_an_async_reward_stays_async_and_is_named(user_rewards):
    import asyncio
    import inspect

    function = user_rewards("raises_later")
    assert inspect.iscoroutinefunction(function)  # TRL gathers async rewards on its event loop
    assert function.__name__ == "raises_later"  # TRL's metric name
    with pytest.raises(RewardFunctionError, match=r"user_rewards_mod:raises_later \(rewards\[1\]\) raised KeyError"):
        asyncio.run(function(prompts=["p"], completions=[chat("a")]))


def test_a_guarded_reward_keeps_its_values_and_name(user_rewards):
    function = user_rewards("generated")
    assert function.__name__ == "generated"
    assert list(function(prompts=["p", "q"], completions=[chat("a"), chat("b")])) == [0.0, 1.0]
    assert user_rewards("judge").__name__ == "judge"  # a callable object: the attribute's name
