"""Tensor-parallel groups in colocate mode: formation, prompt gather/slice-back, seeds.

Pure functions (no torch): `ColocatedVLLM` applies them to `torch.distributed` results.

Rules (docs/sleep-policy.md, "Tensor parallel"): a TP group is `tp` consecutive global ranks
inside one node, so `tp` must divide gpus_per_node (the job's rule, rules.TP_IN_ONE_NODE).
Every rank of a group gathers the group's prompts, generates all of them with the same engine
(vLLM shards the model over the group), and keeps its own slice; the ranks must feed identical
requests with identical seeds, or the shards diverge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from colocgrpo_training.rules import TP_IN_ONE_NODE, Field, config_path

T = TypeVar("T")


class TPLayoutError(ValueError):
    """A TP size the layout cannot satisfy; the message names the field."""


@dataclass(frozen=True)
class TPPlacement:
    group_index: int
    rank_in_group: int
    group_ranks: tuple[int, ...]


def form_tp_groups(
    world_size: int, tp: int, gpus_per_node: int | None = None, per_node_name: str | None = None
) -> list[list[int]]:
    """Consecutive ranks, `tp` per group; a group never spans two nodes.

    `per_node_name` is what a refusal calls `gpus_per_node` (None: the config's `resources.gpus_per_node`), for a
    caller whose count comes from elsewhere, such as the launch's `$LOCAL_WORLD_SIZE`.
    """
    if tp < 1:
        raise TPLayoutError(f"vllm.tensorParallelSize must be >= 1, got {tp}")
    if world_size < 1:
        raise TPLayoutError(f"world size must be >= 1, got {world_size}")
    per_node = gpus_per_node if gpus_per_node is not None else world_size
    if per_node < 1 or world_size % per_node:
        raise TPLayoutError(f"world size {world_size} is not a multiple of gpusPerNode {per_node}")
    gpus_field = TP_IN_ONE_NODE.fields["gpus"]

    def path(field: Field) -> str:
        return per_node_name if per_node_name is not None and field is gpus_field else config_path(field)

    problem = TP_IN_ONE_NODE.problem({"tp": tp, "gpus": per_node}, path, "")
    if problem is not None:
        raise TPLayoutError(": ".join(problem))
    return [list(range(start, start + tp)) for start in range(0, world_size, tp)]


def placement(rank: int, world_size: int, tp: int, gpus_per_node: int | None = None) -> TPPlacement:
    groups = form_tp_groups(world_size, tp, gpus_per_node)
    if not 0 <= rank < world_size:
        raise TPLayoutError(f"rank {rank} outside world size {world_size}")
    index = rank // tp
    return TPPlacement(index, rank % tp, tuple(groups[index]))


def flatten_group(per_rank: Sequence[Sequence[T]]) -> list[T]:
    """The group's requests, in rank order (what every rank of the group generates)."""
    return [item for chunk in per_rank for item in chunk]


def slice_back(outputs: Sequence[T], sizes: Sequence[int], rank_in_group: int) -> list[T]:
    """This rank's share of the group's outputs; `sizes` are the per-rank request counts
    gathered with the prompts (ranks may hold different counts, e.g. a last partial batch)."""
    if len(outputs) != sum(sizes):
        raise ValueError(f"{len(outputs)} outputs for {sum(sizes)} gathered requests")
    start = sum(sizes[:rank_in_group])
    return list(outputs[start : start + sizes[rank_in_group]])


def request_seeds(base_seed: int, group_index: int, generation_index: int, n_requests: int) -> list[int]:
    """One seed per request of a group's generate call.

    Identical on every rank of a group (it depends only on values the group shares),
    distinct across requests (duplicated GRPO prompts must still sample differently) and
    across groups and generations. 63-bit, as vLLM's SamplingParams.seed accepts.
    """
    seeds = []
    for i in range(n_requests):
        digest = hashlib.blake2b(f"{base_seed}/{group_index}/{generation_index}/{i}".encode(), digest_size=8).digest()
        seeds.append(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    return seeds


def engine_seed(base_seed: int, rank: int, tp: int) -> int:
    """The seed vLLM is built with: equal within a group (building the engine reseeds the
    process's RNGs, and ranks of a group must stay in lock-step)."""
    return base_seed + rank // tp
