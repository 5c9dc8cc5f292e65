"""Built-in rewards with open-r1's meaning (src/open_r1/rewards.py).

TRL calls each with `completions` (conversational: a list of messages per completion)
and every dataset column as a keyword argument. Each returns one float per completion,
or None where it has no opinion: TRL 1.16 turns None into NaN and ignores it (nansum /
nanmean), so an unscorable sample does not drag the group mean to 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

# open-r1's format: think block, then answer block, nothing else.
FORMAT_PATTERN = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)


# A whole number or decimal, with its sign: what `last_number` reads.
NUMBER_PATTERN = re.compile(r"-?\d+(?:\.\d+)?")

# What TRL calls per batch: one score per completion (None: no score for that completion).
RewardFunction = Callable[..., Sequence[float | None]]


def completion_text(completion: Any) -> str:
    """The text of one completion: conversational (list of messages) or standard (string)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[0], dict):
        # open-r1 reads completion[0]; TRL's conversational completion is one assistant message.
        return str(completion[0].get("content") or "")
    return str(completion)


def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when math_verify says the completion's answer equals the gold solution, else 0.0.

    A gold solution that math_verify cannot parse is skipped (None), not scored (open-r1
    gives 1.0 there, the same for every completion of the prompt). The gold answer is
    parsed with math_verify's default extractors (LaTeX and plain expressions).
    """
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    rewards: list[float | None] = []
    for completion, gold in zip(completions, solution, strict=True):
        gold_parsed = parse(str(gold), extraction_mode="first_match")
        if len(gold_parsed) == 0:
            rewards.append(None)
            continue
        answer_parsed = parse(
            completion_text(completion),
            extraction_config=[
                LatexExtractionConfig(
                    normalization_config=NormalizationConfig(
                        nits=False,
                        malformed_operators=False,
                        basic_latex=True,
                        equations=True,
                        boxed="all",
                        units=True,
                    ),
                    # \boxed{} is tried first; a bare number without an anchor does not count.
                    boxed_match_priority=0,
                    try_extract_without_anchor=False,
                )
            ],
            extraction_mode="first_match",
        )
        try:
            rewards.append(float(verify(gold_parsed, answer_parsed)))
        except Exception:  # math_verify's sympy comparison can fail on exotic input: a wrong answer
            rewards.append(0.0)
    return rewards


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly `<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>`."""
    return [1.0 if FORMAT_PATTERN.match(completion_text(c)) else 0.0 for c in completions]


def tag_count_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.25 for each of the four format tags that appears exactly once (open-r1's partial credit)."""

    def count_tags(text: str) -> float:
        score = 0.0
        for tag in ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>"):
            if text.count(tag) == 1:
                score += 0.25
        return score

    return [count_tags(completion_text(c)) for c in completions]


def last_number_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when the last number in the completion equals the gold solution, else 0.0.

    For numeric answers a small chat model gives in a sentence ("10 + 4 = 14."): no tags and no
    LaTeX needed. Numbers compare by value (14 == 14.0). A gold solution that is not a number is
    skipped (None).
    """
    rewards: list[float | None] = []
    for completion, gold in zip(completions, solution, strict=True):
        gold_text = str(gold).strip()
        if not NUMBER_PATTERN.fullmatch(gold_text):
            rewards.append(None)
            continue
        numbers = NUMBER_PATTERN.findall(completion_text(completion))
        rewards.append(1.0 if numbers and float(numbers[-1]) == float(gold_text) else 0.0)
    return rewards


BUILTIN_REWARDS: dict[str, RewardFunction] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "last_number": last_number_reward,
}
