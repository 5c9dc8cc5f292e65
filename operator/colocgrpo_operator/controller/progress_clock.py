"""When each job's training step last moved, as the operator saw it (for the progress deadline).

The trainer writes `status.progress.step`; the operator notes the moment it first sees each new
value of it, from every event of the job and every reconcile, per incarnation. Kept in memory
only: an operator that starts anew counts from its start, so a deadline can only come later than
it would have, never sooner.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from colocgrpo_operator.controller.snapshots import Key


class StepClock:
    """The moment each job's current step was first seen."""

    def __init__(self) -> None:
        self._seen: dict[Key, tuple[str, Any, datetime]] = {}  # key -> (uid, step, first seen)

    def observe(self, key: Key, cr: Mapping[str, Any] | None, now: datetime) -> datetime | None:
        """Note the step `cr` shows; returns when that step was first seen (None: no step yet)."""
        meta = (cr or {}).get("metadata") or {}
        status = (cr or {}).get("status")
        progress = status.get("progress") if isinstance(status, Mapping) else None
        step = progress.get("step") if isinstance(progress, Mapping) else None
        if not isinstance(step, int) or isinstance(step, bool):
            return None
        uid = str(meta.get("uid") or "")
        seen = self._seen.get(key)
        if seen is None or seen[0] != uid or seen[1] != step:
            self._seen[key] = (uid, step, now)
            return now
        return seen[2]

    def forget(self, key: Key) -> None:
        """The job is gone."""
        self._seen.pop(key, None)
