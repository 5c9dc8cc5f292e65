"""Serve every watched namespace, including those kopf's namespace observer misses.

With `--namespace` names or globs, kopf decides which namespaces to serve from its namespace
observer: it lists the namespaces, then starts a watch — which lists them *again* and watches
from that second listing, and drops the events of that listing. A namespace created between the
two listings (or during any later re-listing of that watch, after a disconnect or an expired
resourceVersion) is in neither the first listing nor the watch: kopf never serves it, and the
jobs in it are never reconciled, until the namespace object itself changes. docs/decisions.md
has the reproduction and the analysis, for upstream.

`NamespaceRescan` closes that gap without replacing kopf's observer: every period it lists the
namespaces and hands them to kopf's own revision function (`revise_namespaces`, the very one
kopf applies to its first listing) under kopf's insights lock, so a namespace kopf missed is
served at the next rescan, with kopf's own matching rules. It only ever adds what the listing
shows (and drops what it shows as terminating, as kopf's listing does); deletions stay with
kopf's watch, which does not miss them the same way.

This reaches into two kopf internals, `kopf._cogs.structs.references.Insights` (the object
`kopf.run(insights=...)` accepts) and `kopf._core.reactor.observation.revise_namespaces`: both
are the same from kopf 1.42.3 to 1.45.2, and the operator tests run on both ends of the range
pyproject.toml allows (1.45.0, which brought the label selectors the operator's watches use, and
the newest 1.45).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import kopf
from kopf._cogs.structs.references import Insights
from kopf._core.reactor.observation import revise_namespaces

from colocgrpo_operator.controller.objects import dig

ListNamespaces = Callable[[], Awaitable[list[dict[str, Any]]]]


def new_insights() -> Insights:
    """A kopf Insights object, for `kopf.run(insights=...)` and `NamespaceRescan`."""
    return Insights()


class NamespaceRescan:
    """Every `period` seconds, list the namespaces and let kopf serve any matching one it lacks.

    Args:
        insights: the Insights object kopf runs with (`kopf.run(insights=...)`).
        patterns: the `--namespace` names and globs kopf was given (never empty: cluster-wide
            operators watch every namespace at once and need no rescan).
        list_namespaces: returns the cluster's namespace objects (raises on API errors).
        period: seconds between rescans.
        logger: where a failing listing is reported (it never stops the loop).
    """

    def __init__(
        self,
        insights: Insights,
        patterns: Sequence[str],
        list_namespaces: ListNamespaces,
        period: float,
        logger: logging.Logger,
    ):
        if not patterns:
            raise ValueError("a rescan needs the namespace patterns kopf serves")
        self.insights = insights
        self.patterns = tuple(patterns)
        self.list_namespaces = list_namespaces
        self.period = period
        self.logger = logger

    async def run(self) -> None:
        """Rescan until cancelled."""
        while True:
            await asyncio.sleep(self.period)
            try:
                namespaces = await self.list_namespaces()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # an API hiccup: the next period tries again
                self.logger.warning("listing namespaces for the rescan failed: %s", error)
                continue
            added = await self.revise(namespaces)
            if added:
                self.logger.warning(
                    "serving namespace(s) kopf's namespace observer had missed: %s", ", ".join(sorted(added))
                )

    async def revise(self, namespaces: list[dict[str, Any]]) -> set[str]:
        """Apply one listing to kopf's insights (waking kopf's watchers up when it changes
        anything); returns the namespaces it added."""
        async with self.insights.revised:
            before = set(self.insights.namespaces)
            # Namespace objects as the API lists them: exactly the raw bodies kopf's own listing hands
            # over, less the deleted ones not served now. kopf counts a namespace as deleted only
            # once the namespace controller has written its conditions, so a namespace deleted a
            # moment ago would be served again, only for its watches to be stopped at its next
            # event: each start and stop makes kopf's orchestrator wait, and serve no new namespace
            # meanwhile.
            listed = [
                ns
                for ns in namespaces
                if not dig(ns, "metadata", "deletionTimestamp") or dig(ns, "metadata", "name") in before
            ]
            raw_bodies = cast(list[kopf.RawBody], listed)
            revise_namespaces(raw_bodies=raw_bodies, insights=self.insights, namespaces=self.patterns)
            after = set(self.insights.namespaces)
            if after != before:
                self.insights.revised.notify_all()
        return {str(name) for name in after - before if name is not None}
