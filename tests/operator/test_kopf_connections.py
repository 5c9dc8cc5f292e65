"""The bound on kopf's HTTP connection pool: it must leave room for every watch stream
(a request waiting behind watches that never end would hang the operator)."""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.kopf_glue.config import OperatorConfig


def kopf_connection_limit(**settings: Any) -> int:
    return OperatorConfig(**settings).kopf_connection_limit()


def test_cluster_wide_gets_the_pool_plus_one_set_of_watches() -> None:
    assert kopf_connection_limit() == 8 + 2 + 5
    assert kopf_connection_limit(namespaces=()) == 15


def test_each_named_namespace_adds_room_for_its_watches() -> None:
    one = kopf_connection_limit(namespaces=("a",))
    three = kopf_connection_limit(namespaces=("a", "b", "c"))
    assert three - one == 2 * 5
    assert three - 8 - 2 >= 3 * 4  # at least the four watched resources per namespace


def test_globs_and_a_zero_pool_mean_unbounded() -> None:
    assert kopf_connection_limit(namespaces=("team-*",)) == 0
    assert kopf_connection_limit(namespaces=("a", "!kube-system")) == 0
    assert kopf_connection_limit(kopf_connections=0) == 0
    assert kopf_connection_limit(kopf_connections=16, namespaces=("a",)) == 16 + 2 + 5
