"""Trimmed views of watched objects, for kopf's in-memory indices.

Only the fields status derivation reads are kept: 500 jobs with their pods then cost
kilobytes, not the megabytes of full objects (managedFields alone dwarf the rest).
Copies are shallow, on purpose: every watch event brings a freshly decoded object that kopf
replaces, never edits, and nothing downstream mutates its inputs (status.assess builds new
dicts), so deep copies would only burn CPU — they were the operator's top cost at 500 jobs.

The indices hold each view packed into one compact JSON string (`pack`), decoded when a
reconcile reads it (`newest_view`, `all_views`). As dicts, a job's three views were ~250 small
objects (~20 KiB; the job's spec and status conditions most of it) against ~3.5 KiB packed;
and small objects that outlive a burst of watch events, scattered among the burst's freed
ones, keep Python's allocator from giving those pages back (docs/benchmarks/operator.md).
Decoding a view costs tens of microseconds, next to a reconcile's milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from colocgrpo_operator.api.naming import (
    COMPLETION_INDEX_KEY,
    GPU_MEMORY_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    OPERATOR_ANNOTATION_PREFIX,
    RECORD_ANNOTATION,
    SUSPEND_REQUESTED_ANNOTATION,
)

Key = tuple[str, str]  # (namespace, name): a job's key in every index
# (the ColocGRPOJob, its batch Job, the Job's pods, the Kueue Workloads of Jobs of its name) as the
# indices hold them now, decoded
Inputs = tuple[dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode


def _pick(source: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(source, Mapping):
        return {}
    return {k: source[k] for k in keys if k in source and source[k] is not None}


def _owner_uids(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    owners = meta.get("ownerReferences") or []
    return [
        {"uid": o.get("uid"), "kind": o.get("kind"), "name": o.get("name")} for o in owners if isinstance(o, Mapping)
    ]


# Ours among the annotations under the operator's prefix (the rest is kopf's bookkeeping): the
# planner's GPU memory and the operator's record of the job (record.py).
_KEPT_ANNOTATIONS = frozenset({GPU_MEMORY_ANNOTATION, RECORD_ANNOTATION})


def job_resource_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ColocGRPOJob: identity, spec and status (kopf's bookkeeping annotations dropped)."""
    meta = body.get("metadata") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not (k.startswith(f"{OPERATOR_ANNOTATION_PREFIX}/") and k not in _KEPT_ANNOTATIONS)
        and not k.startswith("kopf.")
        and k != "kubectl.kubernetes.io/last-applied-configuration"
    }
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": dict(
            _pick(meta, ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp", "labels")),
            annotations=annotations,
        ),
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


def batch_job_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    # The queue label tells whether Kueue admits the Job (its webhook may have put it there).
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k == KUEUE_QUEUE_LABEL}
    # ...and the suspend the operator asked of it, whether someone else (Kueue) suspended it.
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k == SUSPEND_REQUESTED_ANNOTATION}
    return {
        "metadata": dict(
            _pick(meta, ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")),
            labels=labels,
            annotations=annotations,
            ownerReferences=_owner_uids(meta),
        ),
        "spec": _pick(body.get("spec"), ("suspend", "completions", "parallelism")),
        "status": _pick(
            body.get("status"), ("conditions", "startTime", "completionTime", "active", "ready", "succeeded", "failed")
        ),
    }


def pod_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return {
        "metadata": dict(
            _pick(meta, ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")),
            labels={k: v for k, v in labels.items() if k == COMPLETION_INDEX_KEY},
            ownerReferences=_owner_uids(meta),
        ),
        "spec": _pick(body.get("spec"), ("nodeName",)),
        "status": _pick(
            body.get("status"),
            ("phase", "reason", "message", "conditions", "containerStatuses", "initContainerStatuses"),
        ),
    }


def workload_owner_job(body: Mapping[str, Any]) -> str | None:
    """The name of the batch/v1 Job a Kueue Workload belongs to (None for any other Workload)."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("kind") == "Job" and owner.get("apiVersion") == "batch/v1":
            name = owner.get("name")
            return name if isinstance(name, str) else None
    return None


def workload_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Kueue Workload: whose it is, and its admission conditions (the reason a Job waits)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    conditions = [
        _pick(c, ("type", "status", "reason", "message"))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") in ("QuotaReserved", "Admitted", "Evicted")
    ]
    view: dict[str, Any] = {
        "metadata": dict(_pick(meta, ("name", "uid", "deletionTimestamp")), ownerReferences=_owner_uids(meta)),
        "status": {"conditions": conditions},
    }
    cluster_queue = (status.get("admission") or {}).get("clusterQueue")
    if cluster_queue:
        view["status"]["admission"] = {"clusterQueue": cluster_queue}
    return view


def drop_managed_fields(body: Mapping[str, Any]) -> None:
    """Empty the managedFields of a watch event's object, in place, as its indexer sees it.

    kopf keeps the event's object while its handlers run (a new job's create handler waits
    seconds for the API threads in a burst) and while the object's worker idles, and nothing in
    the operator or in kopf reads managedFields: often the largest part of an object (one entry
    per writer, each a tree of the fields it set), they are dropped before anything holds them.
    The indexers run first for every event, so every later reader sees the object without them.
    """
    fields = (body.get("metadata") or {}).get("managedFields")
    if isinstance(fields, list):
        fields.clear()


def pack(view: Mapping[str, Any]) -> str:
    """One view as the index keeps it (see the module docstring)."""
    return _compact(view)


def unpack(packed: str) -> dict[str, Any]:
    return json.loads(packed)


def resource_version(view: Mapping[str, Any]) -> int:
    """The view's metadata.resourceVersion as a number (-1 when it has none or it is not one).

    The API calls resourceVersions opaque; kube-apiserver's are etcd revisions, which only grow,
    and the operator compares them in two places only, both about one resource of one API
    server: which of two views is newer (`newest_view`) and whether a listing is newer than a
    view (kopf_glue/index_audit.py). docs/decisions.md says why."""
    value = (view.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else -1


def newest_view(index: Mapping[Any, Iterable[str]], key: Any) -> dict[str, Any] | None:
    """The newest view a kopf index holds under `key`, decoded; None when there is none.

    One object's key usually holds one view. It holds two when an object was deleted and another
    created under the same name while kopf's watch was down: kopf re-lists after such a gap
    without dropping what the listing lacks, so the deleted one stays (until the index audit
    drops it). The newer one is the live one: a name's next incarnation is created after the
    last change of the one before, so its resourceVersion is higher."""
    views = [unpack(packed) for packed in index.get(key) or ()]
    return max(views, key=resource_version) if views else None


def all_views(index: Mapping[Any, Iterable[str]], key: Any) -> list[dict[str, Any]]:
    return [unpack(packed) for packed in index.get(key) or ()]


def has_view(index: Mapping[Any, Iterable[str]], key: Any) -> bool:
    return bool(index.get(key))
