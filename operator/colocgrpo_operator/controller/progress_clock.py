"""When each job's training step last moved, as the operator saw it (for the progress deadline).

The trainer writes `status.progress.step`; the operator notes the moment it first sees each new
value of it, from every event of the job and every reconcile, per incarnation. Kept in memory
only: an operator that starts anew only knows the step it first sees, not when it was reached, so
it counts from its start (status.py `_progressing`): a deadline can only come later than it would
have, never sooner.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from colocgrpo_operator.controller.snapshots import Key


class StepClock:
    """The moment each job's current step was first seen, and whether it was seen to move there."""

    def __init__(self) -> None:
        # key -> (uid, step, first seen, seen moving: the step changed while this operator looked)
        self._seen: dict[Key, tuple[str, Any, datetime, bool]] = {}

    def observe(self, key: Key, cr: Mapping[str, Any] | None, now: datetime) -> tuple[datetime | None, bool]:
        """Note the step `cr` shows; returns when that step was first seen (None: no step yet) and
        whether it was seen moving there (False for the first step this operator saw of the job)."""
        meta = (cr or {}).get("metadata") or {}
        status = (cr or {}).get("status")
        progress = status.get("progress") if isinstance(status, Mapping) else None
        step = progress.get("step") if isinstance(progress, Mapping) else None
        if not isinstance(step, int) or isinstance(step, bool):
            return None, False
        uid = str(meta.get("uid") or "")
        seen = self._seen.get(key)
        if seen is None or seen[0] != uid:
            self._seen[key] = (uid, step, now, False)
            return now, False
        if seen[1] != step:
            self._seen[key] = (uid, step, now, True)
            return now, True
        return seen[2], seen[3]

    def forget(self, key: Key) -> None:
        """The job is gone."""
        self._seen.pop(key, None)
