"""Log-probs without whole logits: TRL 1.16's fused, chunked LM head, as the trainer runs it, against whole
materialized logits, for every loss type, at world sizes 1 and 4 (gloo, ranks with different data).

`support.fused_head` scores each rank's micro-batches both ways (its docstring says how): the loss's forward and
backward with the old log-probs deferred to it (`ColocGRPOTrainer`'s deferral) and with old and reference log-probs
given, and the no-grad forwards of the old and reference log-probs. The losses, every gradient and every logged
metric (entropy, KL, the clip ratios, the correction's sampling metrics) agree to 1e-5 in float32, and in the fused
way no tensor ever held a logit row over the whole vocabulary, where the materialized way held one per scored
position (the check can fail).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import fused_head, gloo_world

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

pytest.importorskip("trl")

TOLERANCE = 1e-5
CLIPPING = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types that log clip ratios
# At world 4, one loss type of each normalizer TRL uses (per sequence, global token count with its own clipping,
# global token count with ratio clipping, sequence-level ratios): what differs across ranks is the normalizer and
# the gathered metrics, and a trainer per loss type per rank is the test's whole cost.
WORLD4_LOSS_TYPES = ("grpo", "dapo", "cispo", "luspo")


def _run(world: int, root: Path, model: Path, loss_types: tuple[str, ...]) -> list[dict[str, Any]]:
    gloo_world.run_world(fused_head.compare_heads, world, str(model), str(root), loss_types)
    return [json.loads((root / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def world1(tmp_path_factory, tiny_model_dir) -> list[dict[str, Any]]:
    return _run(1, tmp_path_factory.mktemp("fused-world1"), tiny_model_dir, fused_head.LOSS_TYPES)


@pytest.fixture(scope="module")
def world4(tmp_path_factory, tiny_model_dir) -> list[dict[str, Any]]:
    return _run(4, tmp_path_factory.mktemp("fused-world4"), tiny_model_dir, WORLD4_LOSS_TYPES)


def _assert_equal_ways(ranks: list[dict[str, Any]], loss_types: tuple[str, ...]) -> None:
    for rank, results in enumerate(ranks):
        assert list(results) == list(loss_types)
        for loss_type, entry in results.items():
            where = f"rank {rank}, {loss_type}"
            no_grad = entry["no_grad"]
            assert no_grad["old"] < TOLERANCE and no_grad["ref"] < TOLERANCE, (where, no_grad)
            whole = fused_head.ROWS * (entry["completion_length"] + 1)
            assert no_grad["vocab_rows"] == {"fused": 0, "materialized": whole}, where
            for case in ("deferred", "given"):
                diff = entry[case]
                assert diff["loss"] < TOLERANCE and diff["ratio"] < TOLERANCE, (where, case, diff)
                assert diff["grad"] < TOLERANCE and diff["grad_norm"] > 0.1, (where, case, diff)
                assert diff["metrics"] and max(diff["metrics"].values()) < TOLERANCE, (where, case, diff["metrics"])
                assert diff["vocab_rows"] == {"fused": 0, "materialized": whole}, (where, case)
                metrics = diff["fused_metrics"]
                assert metrics["kl"] > 0 and metrics["entropy"] > 0, (where, case, metrics)
            # The compared terms are active: the correction far from 1, clipping where the loss type clips.
            assert entry["deferred"]["fused_metrics"]["sampling/importance_sampling_ratio/max"] > 1.2, where
            given = entry["given"]["fused_metrics"]
            if loss_type in CLIPPING:
                assert given["clip_ratio/region_mean"] > 0, (where, given)
            elif loss_type == "cispo":
                assert given["cispo_clip_ratio"] > 0, (where, given)


def test_one_rank_scores_every_loss_type_alike_without_whole_logits(world1):
    _assert_equal_ways(world1, fused_head.LOSS_TYPES)


def test_four_ranks_with_different_data_score_alike_and_gather_the_same_metrics(world4):
    _assert_equal_ways(world4, WORLD4_LOSS_TYPES)
    lengths = {ranks["grpo"]["completion_length"] for ranks in world4}
    assert len(lengths) == 4, "every rank must see its own completion length"
    for loss_type in WORLD4_LOSS_TYPES:
        for case in ("deferred", "given"):
            # Gathered or reduced across ranks by TRL and the deferral: the same value on every rank.
            per_rank = [ranks[loss_type][case]["fused_metrics"] for ranks in world4]
            for name in ("kl", "entropy", *(k for k in per_rank[0] if k.startswith(("sampling/", "clip_ratio/")))):
                values = [metrics[name] for metrics in per_rank]
                assert max(values) - min(values) < TOLERANCE, (loss_type, case, name, values)
