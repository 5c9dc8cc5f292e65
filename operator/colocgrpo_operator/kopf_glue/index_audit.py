"""Drop what kopf's indices still hold of objects deleted while a watch was down.

kopf re-lists a resource whenever its watch cannot resume (410 Gone: after an API server
restart, or a resourceVersion too old for the watch cache) and hands every listed object to the
indexers again. An object deleted in the gap is in neither the listing nor the watch, and kopf
never drops its entry: it stays in the index for good. Under one key that means a deleted job
beside the live one of the same name (the reconciles took the first and met only a deleted
object: the live job never got a status), a pod that no longer exists counted among the
gang's, a batch Job that is gone.

`IndexAudit` closes that gap the way client-go's re-list does (its store drops what a listing
lacks): every period, for each namespace the audited indices hold entries in, it lists each
audited kind and drops the entries of objects the listing lacks, when the listing is newer than
the entry's view (an entry newer than the listing may be of an object created after it). Each
job whose entries changed is reconciled again.

This reaches into one kopf internal, `_discard` of the indices kopf hands the handlers (the
removal kopf applies on a DELETED event), the same from kopf 1.42.3 to 1.45.2; the operator
tests run on both ends of the range pyproject.toml allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import kopf
from kopf._cogs.structs.references import NamespaceName
from kopf._core.engines.indexing import Index as KopfIndex

from colocgrpo_operator.controller.snapshots import Key, resource_version, unpack

# kopf's key of one object in an index: (namespace, name, uid).
ObjectKey = tuple[str | None, str | None, str | None]
# Lists one kind in one namespace: (kind, namespace, label selector or None) -> the API's list object.
ListObjects = Callable[[str, str, str | None], Awaitable[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class AuditedIndex:
    """One kopf index the audit keeps honest.

    Attributes:
        kind: the kind its entries are views of (for the listing and the log).
        index: the index (job key -> packed views carrying namespace, name, uid, resourceVersion).
        selector: the label selector kopf watches that kind with (None: every object).
    """

    kind: str
    index: kopf.Index[Key, str]
    selector: str | None = None


@dataclasses.dataclass(frozen=True)
class Dropped:
    """One entry the audit dropped: the job it was indexed under and the object it was of."""

    kind: str
    job: Key
    name: str
    uid: str


class IndexAudit:
    """Every `period` seconds, drop index entries of objects the API no longer has.

    Args:
        audited: the indices to audit, each with the kind of its entries.
        list_objects: lists one kind in one namespace (raises on API errors).
        period: seconds between audits.
        on_dropped: called with each job key whose entries an audit dropped (once per key).
        logger: where drops (INFO) and failed listings (WARNING) are reported.
    """

    def __init__(
        self,
        audited: Sequence[AuditedIndex],
        list_objects: ListObjects,
        period: float,
        on_dropped: Callable[[Key], None],
        logger: logging.Logger,
    ):
        self.audited = tuple(audited)
        self.list_objects = list_objects
        self.period = period
        self.on_dropped = on_dropped
        self.logger = logger

    async def run(self) -> None:
        """Audit until cancelled; a failed listing is retried at the next period."""
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.audit_once()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # an API hiccup: the next period tries again
                self.logger.warning("auditing the indices failed: %s", error)

    async def audit_once(self) -> list[Dropped]:
        """One audit of every audited index; returns what it dropped."""
        dropped: list[Dropped] = []
        for audited in self.audited:
            by_namespace: dict[str, dict[ObjectKey, Key]] = {}
            for object_key, (job, _) in _entries(audited.index, list(audited.index)).items():
                if object_key[0] is not None:
                    by_namespace.setdefault(object_key[0], {})[object_key] = job
            for namespace, entries in sorted(by_namespace.items()):
                listing = await self.list_objects(audited.kind, namespace, audited.selector)
                dropped += _drop_unlisted(audited, entries, listing)
        for job in dict.fromkeys(d.job for d in dropped):
            self.on_dropped(job)
        if dropped:
            self.logger.info(
                "dropped %d index entries of objects deleted while a watch was down: %s",
                len(dropped),
                ", ".join(f"{d.kind} {d.job[0]}/{d.name} (uid {d.uid})" for d in dropped),
            )
        return dropped


def _entries(index: kopf.Index[Key, str], jobs: Iterable[Key]) -> dict[ObjectKey, tuple[Key, int]]:
    """The objects an index holds under those job keys: each one's kopf key -> (the job key it
    is under, its resourceVersion)."""
    found: dict[ObjectKey, tuple[Key, int]] = {}
    for job in jobs:
        for packed in index.get(job) or ():
            view = unpack(packed)
            meta = view.get("metadata") or {}
            found[(meta.get("namespace"), meta.get("name"), meta.get("uid"))] = (job, resource_version(view))
    return found


def _drop_unlisted(audited: AuditedIndex, entries: dict[ObjectKey, Key], listing: dict[str, Any]) -> list[Dropped]:
    """Drop those entries (of one namespace, as found before `listing` was asked for) whose
    objects `listing` lacks, if the listing is newer than the entry as the index holds it now.
    Runs on the event loop without awaiting, so kopf cannot change the index meanwhile."""
    listed_at = resource_version(listing)
    if listed_at < 0 or not isinstance(audited.index, KopfIndex):
        return []
    live = {(item.get("metadata") or {}).get("uid") for item in listing.get("items") or []}
    unlisted = {key for key in entries if key[2] is not None and key[2] not in live}
    now = _entries(audited.index, {entries[key] for key in unlisted})  # re-read: the index may have moved on
    dropped = []
    for object_key in sorted(unlisted & now.keys(), key=str):
        job, version = now[object_key]
        if not 0 <= version < listed_at:
            continue
        ns, name, uid = object_key
        # kopf's own removal of a deleted object's entry (its key: namespace, name, uid).
        audited.index._discard((NamespaceName(str(ns)), name, uid))
        dropped.append(Dropped(audited.kind, job, str(name), str(uid)))
    return dropped
