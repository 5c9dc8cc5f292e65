"""The operator's ledger of its own last writes of each job, and what a reconcile starts from.

The watch, and so the index a reconcile reads, may lag behind the operator's own writes: deciding
from an index that shows an older status or no record yet could count a failure twice, announce a
phase twice, or take the operator's own write for someone else's. The ledger keeps, per job
incarnation, what the operator last wrote, so a reconcile starts from that (`WriteLedger.current`),
and a status someone else wrote (the trainer's token may patch the status subresource) is told
apart from a late echo of the operator's own (`WriteLedger.status_drifted`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from colocgrpo_operator.controller.record import Record, record_of
from colocgrpo_operator.controller.snapshots import Key, pack, unpack

# How many of the operator's last writes of a job are recognised by their resourceVersion (a
# reconcile writes at most the record and the status; the one before may still be in flight).
_KEPT_VERSIONS = 4


def status_without_progress(cr: Mapping[str, Any] | None) -> dict[str, Any]:
    """The job's status without the trainer's `progress` (the part the operator writes)."""
    status = (cr or {}).get("status")
    return {k: v for k, v in status.items() if k != "progress"} if isinstance(status, Mapping) else {}


def version_of(obj: Mapping[str, Any] | None) -> str | None:
    """The object's resourceVersion (None when it has none)."""
    version = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) and version else None


@dataclasses.dataclass(frozen=True)
class _Known:
    """What the operator last wrote for one incarnation (`uid`) of a job: its last two statuses
    (packed, newest last), its record (encoded; None while the job has none), and the
    resourceVersions of the objects its last writes produced, with the status the newest of them
    holds (packed). resourceVersions are only compared for equality (the API calls them opaque):
    a version one of these writes produced is never someone else's write, and one older than the
    newest lags behind it. Otherwise the contents are compared: the index has caught up once it
    shows the newest status and the record; showing an older status of ours, it lags; showing any
    other status, someone else wrote it, and the index is what is there.

    The versions matter in a burst: the event of the record's own patch (written before the first
    batch Job, with no status yet) often reaches the operator only after the first status write,
    and must not pass for someone else emptying the status."""

    uid: str
    statuses: tuple[str, ...]
    record: str | None
    phase: str | None  # the phase last written (and announced by an Event)
    versions: tuple[str, ...] = ()  # newest last
    versioned_status: str | None = None  # the status (packed) of the object at versions[-1]


@dataclasses.dataclass
class Current:
    """What one reconcile takes to be in place, updated by its own writes: the job's status
    (without progress) and its record (None when it has none yet)."""

    status: dict[str, Any]
    record: Record | None

    def record_or_empty(self) -> Record:
        """The record, or an empty one while the job has none."""
        return self.record if self.record is not None else Record()


class WriteLedger:
    """The operator's own last writes, per job (the module docstring says what for)."""

    def __init__(self) -> None:
        self._known: dict[Key, _Known] = {}

    def _of(self, key: Key, cr: Mapping[str, Any] | None) -> _Known | None:
        """What the operator wrote for the incarnation `cr` is (None: nothing, or for another)."""
        known = self._known.get(key)
        uid = ((cr or {}).get("metadata") or {}).get("uid")
        return known if known is not None and known.uid == uid else None

    def record(self, key: Key, cr: Mapping[str, Any] | None) -> Record | None:
        """The operator's record of the job: its own last write while the index has not caught up
        with it, else the one on `cr` (None when the job has none)."""
        known = self._of(key, cr)
        if known is not None and known.record is not None:
            return Record.decode(known.record)
        return record_of(dict(cr) if cr is not None else None)

    def status_drifted(self, key: Key, cr: Mapping[str, Any] | None) -> bool:
        """Whether `cr` carries a status, progress aside, that is none of the operator's own last
        writes: someone else wrote it, so it is derived again (and rewritten) at once."""
        known = self._of(key, cr)
        if known is None or cr is None or not known.statuses:
            return False
        if version_of(cr) in known.versions:
            return False  # an object one of the operator's own writes produced
        status = status_without_progress(cr)
        return all(unpack(packed) != status for packed in known.statuses)

    def current(self, key: Key, cr: dict[str, Any]) -> Current:
        """The job's status and record as a reconcile starts from them: the operator's own last
        writes where the index has not caught up with them (_Known says how that is told)."""
        meta = cr.get("metadata") or {}
        indexed = status_without_progress(cr)
        record = record_of(cr)
        known = self._known.get(key)
        if known is None:
            return Current(indexed, record)
        if known.uid != meta.get("uid"):
            self._known.pop(key, None)  # a previous incarnation's: never carried over
            return Current(indexed, record)
        version = version_of(cr)
        if version is not None and version in known.versions[:-1] and known.versioned_status is not None:
            indexed = unpack(known.versioned_status)  # the index shows an older object of our writes
        elif known.statuses:
            newest = unpack(known.statuses[-1])
            if indexed != newest and any(unpack(packed) == indexed for packed in known.statuses[:-1]):
                indexed = newest  # the index still shows an older write of ours
        if known.record is not None and (record is None or record.encode() != known.record):
            record = Record.decode(known.record)  # the index has not caught up with the record
        return Current(indexed, record)

    def announced_phase(self, key: Key, uid: str) -> str | None:
        """The phase the operator last wrote (and announced) for incarnation `uid`, if it knows it."""
        known = self._known.get(key)
        return known.phase if known is not None and known.uid == uid else None

    def remember(
        self, key: Key, uid: str, current: Current, status: dict[str, Any] | None, written: Mapping[str, Any] | None
    ) -> None:
        """Keep what was just written (`status`, when a status write) with the record in place, and
        the version of the object the write produced (`written`, the API server's answer)."""
        known = self._known.get(key)
        ours = known is not None and known.uid == uid
        # Only statuses this operator wrote: one someone else wrote must never pass for its own.
        statuses = known.statuses if known is not None and ours else ()
        if status is not None:
            statuses = (*statuses[-1:], pack(status))
        phase = status.get("phase") if status is not None else (known.phase if known is not None else None)
        record = None if current.record is None else current.record.encode()
        versions = known.versions if known is not None and ours else ()
        versioned_status = known.versioned_status if known is not None and ours else None
        version = version_of(written)
        if version is not None and isinstance(written, Mapping):
            versions = (*versions[-(_KEPT_VERSIONS - 1) :], version)
            versioned = pack(status_without_progress(written))
            # The same string as the newest status where they agree (the common case): no copy.
            versioned_status = statuses[-1] if statuses and statuses[-1] == versioned else versioned
        self._known[key] = _Known(uid, statuses, record, phase, versions, versioned_status)

    def forget(self, key: Key) -> None:
        """The job is gone: drop what was written for it."""
        self._known.pop(key, None)
