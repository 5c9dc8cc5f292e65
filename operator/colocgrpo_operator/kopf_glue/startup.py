"""The operator's start and stop: every kopf setting, the `OperatorRuntime`, kopf's login.

The startup handler reads the `OperatorConfig` that `colocgrpo-operator` put in kopf's memo
(run.py; the defaults when there is none), applies the kopf settings below and builds the
runtime into `memo.runtime`; the cleanup handler closes it.

Why each kopf setting:
- watch timeouts: a watch stream that silently stops delivering events is kopf's best-known
  failure mode (a load balancer or apiserver restart drops it without closing); a bounded
  server timeout plus a slightly longer client timeout make kopf reconnect and re-list.
- label selectors: only our children are watched; the apiserver filters pods and Jobs by label,
  so an operator in a busy cluster does not receive (and hold in memory) every pod there is.
- progress / diffbase live under our own `colocgrpo.io/` annotation prefix, so `kubectl get
  -o yaml` shows who put them there, and nothing collides with another kopf operator. No
  finalizer is configured: no handler needs one (controller/housekeeping.py says why), so kopf
  adds none.
- posting level WARNING+ for kopf's own log-derived Events: our handlers post one Event per
  phase transition themselves; kopf's chatter ("Handler succeeded") would flood `describe`.
- queueing: per-object workers idle out quickly; no global limit (fairness across jobs). An idle
  worker still holds the last watch event it processed (a full object): with kopf's 5 s default,
  a 500-job burst kept ~1000 of them alive at once, and the allocator keeps that peak as RSS
  afterwards (docs/benchmarks/operator.md).
- execution: blocking API calls run in `--api-threads` threads; a handler that fails
  unexpectedly is retried after 5 s, not kopf's default minute.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf

from colocgrpo_operator.api import KIND
from colocgrpo_operator.api.naming import EVENT_NAME_PREFIX, JOB_NAME_LABEL, OPERATOR_ANNOTATION_PREFIX, OPERATOR_NAME
from colocgrpo_operator.controller.snapshots import Key
from colocgrpo_operator.kopf_glue.config import OperatorConfig
from colocgrpo_operator.kopf_glue.namespaces import Insights
from colocgrpo_operator.kopf_glue.runtime import JobIndices, OperatorRuntime
from colocgrpo_operator.kopf_glue.session import kopf_session
from colocgrpo_operator.kopf_glue.transient_logs import install_log_filter
from colocgrpo_operator.kube.credentials import Credentials, CredentialsError, load_credentials

WATCH_SERVER_TIMEOUT_SECONDS = 270
WATCH_CLIENT_TIMEOUT_SECONDS = 300
CONNECT_TIMEOUT_SECONDS = 10
REQUEST_TIMEOUT_SECONDS = 30
WATCH_RECONNECT_BACKOFF_SECONDS = 1.0
WORKER_IDLE_TIMEOUT_SECONDS = 0.5
WORKER_EXIT_TIMEOUT_SECONDS = 2.0
HANDLER_RETRY_BACKOFF_SECONDS = 5


# The only metadata kopf's essence keeps (labels and annotations) and what its key naming reads.
_ESSENCE_METADATA = ("labels", "annotations", "ownerReferences")
# In a job's essence, strings longer than this, and lists and mappings below spec.<section> whose
# JSON is longer than _DIGEST_VALUES_OVER, are kept as their digest (`digested`).
_DIGEST_STRINGS_OVER = 256
_DIGEST_VALUES_OVER = 1024
# A diff-base larger than this is left out (the annotations of an object share 256 KiB).
_MAX_DIFFBASE_BYTES = 192 * 1024


def digested(essence: Any) -> Any:
    """A ColocGRPOJob's essence with every long value of its spec replaced by its digest
    ("sha256:<hex>"). kopf compares essences only to tell whether the spec changed, and the
    frozen-spec check (api.spec_change_problems) only for equality, so a digest tells them as
    much, and the diff-base annotation stays small whatever the spec holds: any spec the API
    server admits is tracked. Idempotent (an essence digested already comes back the same)."""
    if not isinstance(essence, Mapping) or not isinstance(essence.get("spec"), Mapping):
        return essence
    return {**essence, "spec": _digest(essence["spec"], 1)}


def _digest(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return _sha256(value) if len(value) > _DIGEST_STRINGS_OVER else value
    if not isinstance(value, Mapping | list):
        return value
    if depth >= 3:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        if len(text) > _DIGEST_VALUES_OVER:
            return _sha256(text)
    if isinstance(value, Mapping):
        return {key: _digest(item, depth + 1) for key, item in value.items()}
    return [_digest(item, depth + 1) for item in value]


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration annotation, with a job's long values as their digests
    (`digested`), so any spec the API server admits is tracked; left out only for an essence that
    would still not fit (the API server would refuse the annotation, "metadata.annotations: Too
    long", on every event).

    Its essence is built without deep-copying what it drops. kopf builds one for every watch event
    of every watched kind (pods and batch Jobs too) by deep-copying the whole object, managedFields
    and status included, only to delete them from the copy: in a 500-job burst that was a large
    share of the operator's CPU, on the event loop. The result is the same essence.

    A new job's create handler writes the diff-base itself, with the job's first record
    (`annotations`, `written`); kopf's own `store` then leaves it out.
    """

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # uid -> the annotations a handler wrote itself (`written`), until kopf's next `store`.
        self._written: dict[str, dict[str, Any]] = {}

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        if extra_fields:  # a handler reads a field of metadata or status: kopf's own way
            return super().build(body=body, extra_fields=extra_fields)
        meta = body.get("metadata") or {}
        light = {key: value for key, value in body.items() if key not in ("metadata", "status")}
        light["metadata"] = {key: meta[key] for key in _ESSENCE_METADATA if key in meta}
        # The object's own fields, less what kopf's essence drops anyway: still a raw body.
        essence = super().build(body=kopf.Body(cast(kopf.RawBody, light)))
        if body.get("kind") == KIND:
            essence = cast(kopf.BodyEssence, digested(essence))
        return essence

    def annotations(self, *, body: kopf.Body, essence: Any) -> dict[str, Any]:
        """The annotations kopf's `store` would patch in for `essence`: the diff-base and the
        prefix's marker; none for an essence too large to track."""
        if len(json.dumps(essence, separators=(",", ":"), ensure_ascii=False).encode()) > _MAX_DIFFBASE_BYTES:
            return {}
        patch = kopf.Patch()
        super().store(body=body, patch=patch, essence=essence)
        return dict(patch.metadata.annotations)

    def written(self, *, body: kopf.Body, annotations: Mapping[str, Any]) -> None:
        """A handler wrote `annotations` (what `annotations` gave) in a patch of its own: kopf's
        next `store` for this object leaves out the ones it would write the same, and then has
        nothing to patch (handlers.reconcile_job says why)."""
        if body.metadata.uid:
            self._written[body.metadata.uid] = dict(annotations)

    def leave_out_written(self, *, body: kopf.Body, patch: kopf.Patch, forget: bool = False) -> None:
        """Take out of `patch` the annotations a handler already wrote with the same values (and
        with `forget`, forget them: kopf's `store` of the diff-base comes last)."""
        uid = body.metadata.uid or ""
        already = self._written.pop(uid, {}) if forget else self._written.get(uid, {})
        annotations = patch.get("metadata", {}).get("annotations")
        if not already or not isinstance(annotations, dict):
            return
        for key, value in already.items():
            if key in annotations and annotations[key] == value:
                del annotations[key]
        if not annotations:
            del patch["metadata"]["annotations"]
            if not patch["metadata"]:
                del patch["metadata"]

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        for key, value in self.annotations(body=body, essence=essence).items():
            patch.metadata.annotations[key] = value
        self.leave_out_written(body=body, patch=patch, forget=True)


class ProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's handler progress annotations, without the prefix's marker where a handler wrote it
    already (`BoundedDiffBaseStorage.written`): kopf adds the marker to any object that lacks it
    whenever it stores a handler's progress, even when it then purges that progress."""

    def __init__(self, *, diffbase: BoundedDiffBaseStorage, **kwargs: Any):
        super().__init__(**kwargs)
        self.diffbase = diffbase

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().store(key=key, record=record, body=body, patch=patch)
        self.diffbase.leave_out_written(body=body, patch=patch)


def diffbase_of(memo: kopf.Memo) -> BoundedDiffBaseStorage | None:
    """The diff-base storage in use (the startup handler puts it in the memo); None before."""
    storage = memo.get("diffbase")
    return storage if isinstance(storage, BoundedDiffBaseStorage) else None


def config_of(memo: kopf.Memo) -> OperatorConfig:
    """The configuration `colocgrpo-operator` handed over in the memo; the defaults without one
    (the handlers loaded some other way, e.g. by `kopf run`)."""
    config = memo.get("config")
    return config if isinstance(config, OperatorConfig) else OperatorConfig()


def insights_of(memo: kopf.Memo) -> Insights | None:
    """The Insights object `colocgrpo-operator` handed to kopf.run and put in the memo (None when
    the handlers run some other way: then no namespace rescan, kopf_glue/namespaces.py)."""
    insights = memo.get("insights")
    return insights if isinstance(insights, Insights) else None


def apply_kopf_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Every kopf setting the operator changes (the module docstring says why)."""
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.watching.connect_timeout = CONNECT_TIMEOUT_SECONDS
    settings.watching.reconnect_backoff = WATCH_RECONNECT_BACKOFF_SECONDS
    settings.watching.label_selectors["v1", "pods"] = JOB_NAME_LABEL
    settings.watching.label_selectors["batch", "v1", "jobs"] = JOB_NAME_LABEL
    settings.networking.request_timeout = REQUEST_TIMEOUT_SECONDS
    settings.networking.connect_timeout = CONNECT_TIMEOUT_SECONDS

    diffbase = BoundedDiffBaseStorage(prefix=OPERATOR_ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.diffbase_storage = diffbase
    settings.persistence.progress_storage = ProgressStorage(prefix=OPERATOR_ANNOTATION_PREFIX, diffbase=diffbase)

    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = OPERATOR_NAME
    settings.posting.event_name_prefix = EVENT_NAME_PREFIX

    settings.queueing.idle_timeout = WORKER_IDLE_TIMEOUT_SECONDS
    settings.queueing.exit_timeout = WORKER_EXIT_TIMEOUT_SECONDS

    settings.execution.max_workers = config.api_threads
    settings.execution.default_backoff = HANDLER_RETRY_BACKOFF_SECONDS


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any) -> None:
    """Apply the kopf settings and build the `OperatorRuntime` into `memo.runtime`.

    The four indices are handlers.py's, passed by kopf among `kwargs` under their function names;
    empty now, they fill as the watches start. A missing or unusable kubeconfig stops the operator
    here (retrying cannot fix it).
    """
    config = config_of(memo)
    apply_kopf_settings(settings, config)
    install_log_filter()
    memo.diffbase = settings.persistence.diffbase_storage
    memo.runtime = OperatorRuntime.open(
        config,
        credentials=await asyncio.to_thread(_credentials, memo, config),
        indices=JobIndices(
            _index(kwargs, "jobs_by_name"),
            _index(kwargs, "batch_jobs_by_owner"),
            _index(kwargs, "pods_by_owner"),
            _index(kwargs, "workloads_by_job"),
        ),
        executor=settings.execution.executor,
        logger=logging.getLogger("colocgrpo.operator"),
    )
    memo.runtime.start_namespace_rescan(insights_of(memo), logging.getLogger("colocgrpo.operator"))
    logger.info("colocgrpo-operator configured (metrics port %s)", config.metrics_port or "off")


def _index(kwargs: Mapping[str, Any], name: str) -> kopf.Index[Key, str]:
    """The index kopf passed a handler under `name` (an indexing handler's function name)."""
    index = kwargs.get(name)
    if not isinstance(index, kopf.Index):
        raise kopf.PermanentError(f"kopf passed no index {name!r} (kopf_glue/handlers.py declares it)")
    return index


def _credentials(memo: kopf.Memo, config: OperatorConfig) -> Credentials:
    """The credentials `colocgrpo-operator` loaded (one object for the operator's client and kopf's
    session, so an exec plugin runs once per token); else in-cluster ServiceAccount, --kubeconfig
    or $KUBECONFIG, read when asked (not at import)."""
    credentials = memo.get("credentials")
    if isinstance(credentials, Credentials):
        return credentials
    try:
        memo.credentials = load_credentials(config.kubeconfig)
    except CredentialsError as error:
        raise kopf.PermanentError(str(error)) from error  # retrying cannot fix a missing kubeconfig
    return memo.credentials


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.AiohttpSession:
    """kopf's session from the same credentials as the operator's own client (kopf_glue/session.py:
    the current token on every request, so rotated ServiceAccount tokens and expiring exec-plugin
    tokens are picked up without a re-login).

    Our own login handler also replaces kopf's default ones, which would go through the
    official kubernetes client (never imported in the operator, cli/operator.py); and the
    session is ours to bound its connection pool (`OperatorConfig.kopf_connection_limit`).
    kopf closes it with its own.
    """
    config = config_of(memo)
    credentials = await asyncio.to_thread(_credentials, memo, config)
    await asyncio.to_thread(credentials.bearer_token)  # an exec plugin may run: not on the loop
    return kopf_session(credentials, config.kopf_connection_limit(), settings.networking.trust_env)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Close what startup opened (`OperatorRuntime.close`); nothing when startup failed early."""
    runtime = memo.get("runtime")
    if isinstance(runtime, OperatorRuntime):
        await runtime.close()
    logger.info("colocgrpo-operator stopped")
