"""TP groups in colocate mode (the CPU side): formation, gather/slice-back, seeds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colocgrpo_training.generation.tp_groups import (
    TPLayoutError,
    engine_seed,
    flatten_group,
    form_tp_groups,
    placement,
    request_seeds,
    slice_back,
)


def test_groups_are_consecutive_ranks():
    assert form_tp_groups(8, 2, gpus_per_node=4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert form_tp_groups(4, 4, gpus_per_node=4) == [[0, 1, 2, 3]]
    assert form_tp_groups(3, 1) == [[0], [1], [2]]


def test_tp_must_divide_gpus_per_node():
    # 2 nodes × 6 GPUs with TP 4 would put ranks 4..7 across both nodes.
    with pytest.raises(TPLayoutError, match=r"vllm.tensor_parallel_size: must divide resources.gpus_per_node \(6\).*4"):
        form_tp_groups(12, 4, gpus_per_node=6)
    with pytest.raises(TPLayoutError, match="tensorParallelSize must be >= 1"):
        form_tp_groups(4, 0)
    with pytest.raises(TPLayoutError, match="not a multiple of gpusPerNode"):
        form_tp_groups(6, 2, gpus_per_node=4)


@given(nodes=st.integers(1, 4), per_node=st.sampled_from([1, 2, 4, 8]), data=st.data())
@settings(max_examples=100, deadline=None)
def test_no_group_spans_nodes(nodes, per_node, data):
    tp = data.draw(st.sampled_from([d for d in (1, 2, 4, 8) if per_node % d == 0]))
    groups = form_tp_groups(nodes * per_node, tp, per_node)
    assert sorted(r for g in groups for r in g) == list(range(nodes * per_node))
    for g in groups:
        assert len(g) == tp and len({r // per_node for r in g}) == 1
    for rank in range(nodes * per_node):
        p = placement(rank, nodes * per_node, tp, per_node)
        assert p.group_ranks[p.rank_in_group] == rank


@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_gather_then_slice_back_returns_each_ranks_own(sizes):
    per_rank = [[f"r{r}-{i}" for i in range(n)] for r, n in enumerate(sizes)]
    group = flatten_group(per_rank)
    outputs = [f"out({p})" for p in group]  # what every rank of the group generates
    for r in range(len(sizes)):
        assert slice_back(outputs, sizes, r) == [f"out({p})" for p in per_rank[r]]


def test_slice_back_rejects_mismatched_counts():
    with pytest.raises(ValueError, match="3 outputs for 4"):
        slice_back([1, 2, 3], [2, 2], 0)


def test_seeds_equal_within_group_distinct_across_requests_and_groups():
    world, tp = 8, 4
    by_rank = {r: request_seeds(42, placement(r, world, tp).group_index, 3, 16) for r in range(world)}
    assert by_rank[0] == by_rank[1] == by_rank[2] == by_rank[3]
    assert by_rank[4] == by_rank[7]
    assert by_rank[0] != by_rank[4]
    assert len(set(by_rank[0])) == 16  # duplicated GRPO prompts still sample differently
    assert request_seeds(42, 0, 3, 4) != request_seeds(42, 0, 4, 4)  # and across generations
    assert all(0 <= s < 2**63 for s in by_rank[0])
    assert {engine_seed(7, r, 4) for r in range(4)} == {7}
    assert engine_seed(7, 4, 4) == 8
