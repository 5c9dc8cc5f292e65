"""`OperatorRuntime`: what the operator holds for its whole life, in one object.

The startup handler (kopf_glue/startup.py) builds it once and keeps it in kopf's memo as
`memo.runtime`; every handler reaches the shared client, reconciler and housekeeper through it
(`runtime_of(memo)`), and the cleanup handler closes it. kopf hands each object a shallow copy
of the memo, so the runtime is one object for the whole operator, not one per job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import kopf

from colocgrpo_operator.api import KIND
from colocgrpo_operator.api.naming import JOB_NAME_LABEL, OPERATOR_NAME
from colocgrpo_operator.controller.housekeeping import Housekeeper
from colocgrpo_operator.controller.reconciler import Reconciler
from colocgrpo_operator.controller.snapshots import Inputs, Key, all_views, has_view, newest_view
from colocgrpo_operator.kopf_glue.config import OperatorConfig
from colocgrpo_operator.kopf_glue.index_audit import AuditedIndex, IndexAudit
from colocgrpo_operator.kopf_glue.namespaces import Insights, NamespaceRescan
from colocgrpo_operator.kopf_glue.owner import adopt, post_event
from colocgrpo_operator.kube.client import KubeApi
from colocgrpo_operator.kube.credentials import Credentials
from colocgrpo_operator.metrics import JOB_METRICS, start_metrics_server

# The index audit (kopf_glue/index_audit.py) runs once every this many re-check periods.
AUDIT_EVERY_RECHECKS = 3


class JobIndices(NamedTuple):
    """kopf's four in-memory indices (declared in kopf_glue/handlers.py). Live: kopf updates
    them as watch events arrive, so reading one key twice may give two answers."""

    jobs: kopf.Index[Key, str]  # ColocGRPOJobs by (namespace, name)
    batch_jobs: kopf.Index[Key, str]  # the gang's batch Job by its job's key
    pods: kopf.Index[Key, str]  # the gang's pods by their job's key
    workloads: kopf.Index[Key, str]  # Kueue's Workloads of batch Jobs, by the Job's name (empty without Kueue)

    def read(self, key: Key) -> Inputs:
        """One job's inputs as the indices hold them now, decoded. Call it on the event loop
        (kopf updates the indices there), so they cannot change while it decodes them."""
        return (
            newest_view(self.jobs, key),
            newest_view(self.batch_jobs, key),
            all_views(self.pods, key),
            all_views(self.workloads, key),
        )

    def reader(self, key: Key) -> Callable[[], Inputs]:
        """`read` of that key, for when the reconciler has the job's lock."""
        return functools.partial(self.read, key)


class MetricsServer(Protocol):
    def shutdown(self) -> None: ...


class OperatorRuntime:
    """The shared client, reconciler, housekeeper and metrics server of one operator process.

    Attributes:
        config: the settings it was built from.
        indices: kopf's indices, which every reconcile reads its inputs from.
        kube: the blocking Kubernetes client, one connection per executor thread.
        reconciler: the one `Reconciler` every trigger goes through.
        housekeeper: the operator-wide re-check and TTL loop, not yet running (`start_housekeeping`).
        index_audit: drops index entries of objects deleted while a watch was down
            (kopf_glue/index_audit.py); it starts with the housekeeping loop.
        metrics_server: the Prometheus endpoint, None when `config.metrics_port` is 0.
        namespace_rescan: the namespaces kopf's observer missed, served (`start_namespace_rescan`;
            kopf_glue/namespaces.py); None when the operator is cluster-wide or kopf runs without
            insights it was handed.
    """

    def __init__(
        self,
        config: OperatorConfig,
        indices: JobIndices,
        kube: KubeApi,
        reconciler: Reconciler,
        housekeeper: Housekeeper,
        metrics_server: MetricsServer | None,
    ):
        self.config = config
        self.indices = indices
        self.kube = kube
        self.reconciler = reconciler
        self.housekeeper = housekeeper
        self.metrics_server = metrics_server
        self.namespace_rescan: NamespaceRescan | None = None
        self.index_audit = IndexAudit(
            [
                AuditedIndex(KIND, indices.jobs),
                AuditedIndex("Job", indices.batch_jobs, JOB_NAME_LABEL),
                AuditedIndex("Pod", indices.pods, JOB_NAME_LABEL),
            ],
            lambda kind, namespace, selector: asyncio.to_thread(self.kube.list_objects, kind, namespace, selector),
            config.recheck_seconds * AUDIT_EVERY_RECHECKS,
            self._entries_dropped,
            logging.getLogger("colocgrpo.operator"),
        )
        self._housekeeping: asyncio.Task[None] | None = None
        self._rescanning: asyncio.Task[None] | None = None
        self._auditing: asyncio.Task[None] | None = None

    @classmethod
    def open(
        cls,
        config: OperatorConfig,
        credentials: Credentials,
        indices: JobIndices,
        executor: concurrent.futures.Executor,
        logger: logging.Logger,
    ) -> OperatorRuntime:
        """Open the client's connection pool and the metrics endpoint; build the reconciler and
        the housekeeper over `indices`. Blocking API work runs in `executor` (kopf's, sized by
        `config.api_threads`). Raises OSError when the metrics port cannot be bound."""
        kube = KubeApi(credentials, field_manager=OPERATOR_NAME, pool_size=config.api_threads)
        reconciler = Reconciler(
            kube=kube,
            default_image=config.trainer_image,
            executor=executor,
            logger=logger,
            post_event=post_event,
            adopt=adopt,
        )
        housekeeper = Housekeeper(
            reconciler=reconciler,
            jobs=indices.jobs,
            read_inputs=indices.read,
            recheck_seconds=config.recheck_seconds,
            logger=logger,
        )
        try:
            metrics_server = start_metrics_server(config.metrics_port) if config.metrics_port > 0 else None
        except BaseException:
            kube.close()
            raise
        return cls(config, indices, kube, reconciler, housekeeper, metrics_server)

    def start_housekeeping(self) -> None:
        """Start the housekeeping loop, once (later calls do nothing).

        Called from a job handler, not at startup: a task inherits the context it is created in,
        and only handler contexts carry kopf's event-posting queue (`kopf.event`).
        """
        if self._housekeeping is None:
            loop = asyncio.get_running_loop()
            self._housekeeping = loop.create_task(self.housekeeper.run(), name="colocgrpo-housekeeping")
            self._auditing = loop.create_task(self.index_audit.run(), name="colocgrpo-index-audit")

    def _entries_dropped(self, key: Key) -> None:
        """The index audit dropped entries under a job's key: judge the job again from what is
        left, and forget its metrics when the job itself was what went."""
        if not has_view(self.indices.jobs, key):
            JOB_METRICS.forget(key)
        self.reconciler.reconcile_soon(key, self.indices.reader(key), trigger="audit")

    def start_namespace_rescan(self, insights: Insights | None, logger: logging.Logger) -> None:
        """Start the namespace rescan (kopf_glue/namespaces.py) over the Insights object kopf
        runs with; nothing for a cluster-wide operator or without `insights`. Every re-check
        period one namespace listing, served from the apiserver's watch cache."""
        if self.config.clusterwide or insights is None or self._rescanning is not None:
            return

        async def list_namespaces() -> list[dict[str, Any]]:
            listing = await asyncio.to_thread(
                self.kube.request, "GET", "/api/v1/namespaces", query={"resourceVersion": "0"}
            )
            return list((listing or {}).get("items") or [])

        self.namespace_rescan = NamespaceRescan(
            insights, self.config.namespaces, list_namespaces, self.config.recheck_seconds, logger
        )
        loop = asyncio.get_running_loop()
        self._rescanning = loop.create_task(self.namespace_rescan.run(), name="colocgrpo-namespace-rescan")

    async def close(self) -> None:
        """Stop the housekeeping loop, the namespace rescan and the reconciles running in the
        background, then close the connection pool and the metrics endpoint. Safe to call once
        the operator stops."""
        for task in (self._housekeeping, self._rescanning, self._auditing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._housekeeping = self._rescanning = self._auditing = None
        await self.reconciler.schedule.cancel_background()
        self.kube.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()


def runtime_of(memo: kopf.Memo) -> OperatorRuntime:
    """The runtime the startup handler put in `memo`."""
    runtime: OperatorRuntime = memo.runtime
    return runtime
