"""Every kopf setting in one startup handler, plus the shared clients kept in kopf's memo.

Why each value:
- watch timeouts: a watch stream that silently stops delivering events is kopf's best-known
  failure mode (a load balancer or apiserver restart drops it without closing); a bounded
  server timeout plus a slightly longer client timeout make kopf reconnect and re-list.
- finalizer / progress / diffbase live under our own `colocgrpo.io/` prefix, so `kubectl get
  -o yaml` shows who put them there, and nothing collides with another kopf operator.
- posting level WARNING+ for kopf's own log-derived Events: our handlers post one Event per
  phase transition themselves; kopf's chatter ("Handler succeeded") would flood `describe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import kopf

from colocgrpo_operator.api import GROUP, JOB_NAME_LABEL
from colocgrpo_operator.controller.kube import KubeApi, load_api_client
from colocgrpo_operator.controller.metrics import start_metrics_server
from colocgrpo_operator.controller.reconciler import Reconciler

FIELD_MANAGER = "colocgrpo-operator"
FINALIZER = f"{GROUP}/finalizer"

# Configuration handed from `colocgrpo operator` (or tests) to the startup handler.
ENV_TRAINER_IMAGE = "COLOCGRPO_TRAINER_IMAGE"
ENV_METRICS_PORT = "COLOCGRPO_METRICS_PORT"
ENV_ACTIVE_INTERVAL = "COLOCGRPO_RECHECK_SECONDS"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Apply every kopf setting and open the shared Kubernetes client (closed on cleanup)."""
    # Watching: bounded streams, reconnect quickly (see module docstring).
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    # Only our children are watched: the apiserver filters pods and Jobs by label, so an
    # operator in a busy cluster does not receive (and hold in memory) every pod there is.
    settings.watching.label_selectors["v1", "pods"] = JOB_NAME_LABEL
    settings.watching.label_selectors["batch", "v1", "jobs"] = JOB_NAME_LABEL
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10

    # Persistence under our own prefix.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )

    # Events: ours per phase transition; kopf's own only for warnings and errors.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = FIELD_MANAGER
    settings.posting.event_name_prefix = "colocgrpo-"

    # Queueing (formerly "batching"): per-object workers idle out quickly so 500 finished
    # jobs do not keep 500 idle coroutines; no global limit (fairness across jobs).
    settings.queueing.idle_timeout = 5.0
    settings.queueing.exit_timeout = 2.0

    # Sync work (API calls with the blocking client) runs in this many threads.
    settings.execution.max_workers = int(os.environ.get("COLOCGRPO_API_THREADS", "16"))
    # Handlers that fail unexpectedly are retried soon, not after kopf's default minute.
    settings.execution.default_backoff = 5

    # Timers only re-check, so let them stop instantly on deletion.
    settings.background.instant_exit_timeout = 0.1

    api_client = load_api_client(pool_size=settings.execution.max_workers)
    memo.kube = KubeApi(api_client, field_manager=FIELD_MANAGER)
    memo.reconciler = Reconciler(
        kube=memo.kube,
        default_image=os.environ.get(ENV_TRAINER_IMAGE) or None,
        executor=settings.execution.executor,
        logger=logging.getLogger("colocgrpo.operator"),
    )
    port = int(os.environ.get(ENV_METRICS_PORT, "9090") or 0)
    memo.metrics_server = start_metrics_server(port) if port > 0 else None
    logger.info("colocgrpo operator configured (metrics port %s)", port or "off")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster ServiceAccount, else $KUBECONFIG (read now, not at import time).

    kopf's default would go through the kubernetes client's process-wide defaults, which
    freeze KUBECONFIG when the client is first imported; parsing the files directly keeps
    `--kubeconfig` authoritative and supports client certificates (the local dev cluster).
    """
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Stop the housekeeping loop, then close what startup opened (HTTP pool, metrics server)."""
    reconciler = getattr(memo, "reconciler", None)
    task = reconciler.housekeeping if reconciler is not None else None
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        server.shutdown()
    logger.info("colocgrpo operator stopped")
