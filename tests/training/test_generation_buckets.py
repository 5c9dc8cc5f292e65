"""Bucketed weight push: byte budget, every parameter exactly once, stable order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from colocgrpo_training.generation.buckets import plan_buckets


@given(
    sizes=st.lists(st.integers(0, 100), max_size=40),
    budget=st.integers(1, 250),
)
def test_buckets_respect_budget_and_cover_each_param_once_in_order(sizes, budget):
    named = [(f"p{i}", n) for i, n in enumerate(sizes)]
    buckets = plan_buckets(named, budget)
    flat = [i for b in buckets for i in b]
    assert flat == list(range(len(sizes)))  # each exactly once, original order
    for b in buckets:
        assert b, "no empty buckets"
        total = sum(sizes[i] for i in b)
        assert total <= budget or len(b) == 1  # only a single oversized parameter may exceed
    # Greedy packing: a bucket was closed only because the next parameter did not fit.
    for b, nxt in itertools.pairwise(buckets):
        assert sum(sizes[i] for i in b) + sizes[nxt[0]] > budget


def test_oversized_parameter_gets_its_own_bucket():
    assert plan_buckets([("a", 10), ("big", 500), ("b", 10), ("c", 10)], 100) == [[0], [1], [2, 3]]


def test_bad_budget_is_rejected():
    with pytest.raises(ValueError, match="budget must be positive"):
        plan_buckets([("a", 1)], 0)
