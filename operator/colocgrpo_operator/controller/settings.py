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
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from colocgrpo_operator.api.naming import EVENT_NAME_PREFIX, JOB_NAME_LABEL, OPERATOR_ANNOTATION_PREFIX, OPERATOR_NAME
from colocgrpo_operator.controller.credentials import Credentials, CredentialsError, load_credentials
from colocgrpo_operator.controller.kube import KubeApi
from colocgrpo_operator.controller.metrics import start_metrics_server
from colocgrpo_operator.controller.reconciler import Reconciler

FINALIZER = f"{OPERATOR_ANNOTATION_PREFIX}/finalizer"

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
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=OPERATOR_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=OPERATOR_ANNOTATION_PREFIX, key="last-handled-configuration"
    )

    # Events: ours per phase transition; kopf's own only for warnings and errors.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = OPERATOR_NAME
    settings.posting.event_name_prefix = EVENT_NAME_PREFIX

    # Queueing (formerly "batching"): per-object workers idle out quickly; no global limit
    # (fairness across jobs). An idle worker still holds the last watch event it processed (a
    # full object): with kopf's 5 s default, a 500-job burst kept ~1000 of them alive at once,
    # and the allocator keeps that peak as RSS afterwards (docs/benchmarks/operator.md).
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 2.0

    # Sync work (API calls with the blocking client) runs in this many threads.
    settings.execution.max_workers = int(os.environ.get("COLOCGRPO_API_THREADS", "16"))
    # Handlers that fail unexpectedly are retried soon, not after kopf's default minute.
    settings.execution.default_backoff = 5

    # Timers only re-check, so let them stop instantly on deletion.
    settings.background.instant_exit_timeout = 0.1

    memo.kube = KubeApi(_credentials(), field_manager=OPERATOR_NAME, pool_size=settings.execution.max_workers)
    memo.reconciler = Reconciler(
        kube=memo.kube,
        default_image=os.environ.get(ENV_TRAINER_IMAGE) or None,
        executor=settings.execution.executor,
        logger=logging.getLogger("colocgrpo.operator"),
    )
    port = int(os.environ.get(ENV_METRICS_PORT, "9090") or 0)
    memo.metrics_server = start_metrics_server(port) if port > 0 else None
    logger.info("colocgrpo operator configured (metrics port %s)", port or "off")


# kopf's own HTTP session has no connection limit: a burst of 500 jobs opened hundreds of
# TLS connections at once (one per concurrent annotation patch and Event), and their OpenSSL
# buffers left the allocator fragmented long after they closed (10-15 MiB of ~175 at 500 jobs,
# docs/benchmarks/operator.md). The limit counts kopf's long-lived watch streams too, and a
# request waiting for a slot held by watches would wait forever, so the bound is a working
# pool plus room for every watch: three resources per watched namespace (or once cluster-wide)
# and kopf's own CRD/namespace observers. Namespace globs can match any number of namespaces,
# so with a glob there is no bound.
ENV_KOPF_CONNECTIONS = "COLOCGRPO_KOPF_CONNECTIONS"  # the working pool (default 8)
ENV_WATCHED_NAMESPACES = "COLOCGRPO_WATCHED_NAMESPACES"  # comma-separated; set by `colocgrpo operator`
WATCH_CONNECTIONS_PER_NAMESPACE = 4  # ColocGRPOJobs, Jobs, pods, and a spare
OBSERVER_CONNECTIONS = 2  # kopf's CRD and namespace observers


def kopf_connection_limit(environ: Mapping[str, str] = os.environ) -> int:
    """The connection bound of kopf's HTTP session; 0 means unbounded (kopf's default)."""
    pool = int(environ.get(ENV_KOPF_CONNECTIONS, "8"))
    if pool <= 0:
        return 0
    namespaces = [ns for ns in environ.get(ENV_WATCHED_NAMESPACES, "").split(",") if ns]
    if any(char in ns for ns in namespaces for char in "*?[!"):
        return 0
    return pool + OBSERVER_CONNECTIONS + WATCH_CONNECTIONS_PER_NAMESPACE * max(1, len(namespaces))


def _credentials() -> Credentials:
    """In-cluster ServiceAccount, else --kubeconfig / $KUBECONFIG, read when asked (not at import)."""
    try:
        return load_credentials()
    except CredentialsError as error:
        raise kopf.PermanentError(str(error)) from error  # retrying cannot fix a missing kubeconfig


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.AiohttpSession:
    """kopf's session from the same credentials as the operator's own client (a ServiceAccount's
    token is read afresh on each login: kopf logs in again when a rotated-out token gets a 401).

    Our own login handler also replaces kopf's default ones, which would go through the
    official kubernetes client (never imported in the operator, cli/operator.py); and the
    session is ours to bound its connection pool (above). kopf closes it with its own.
    """
    credentials = _credentials()
    return kopf.AiohttpSession(
        aiohttp_session=aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=kopf_connection_limit(), ssl=credentials.ssl_context()),
            headers=credentials.auth_headers(),
            proxy=credentials.proxy_url,
            trust_env=settings.networking.trust_env,
        ),
        server=credentials.server,
        default_namespace=credentials.namespace,
    )


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Stop the housekeeping loop, then close what startup opened (HTTP pool, metrics server)."""
    reconciler = getattr(memo, "reconciler", None)
    task = reconciler.housekeeping if reconciler is not None else None
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if reconciler is not None:
        await reconciler.cancel_background()
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        server.shutdown()
    logger.info("colocgrpo operator stopped")
