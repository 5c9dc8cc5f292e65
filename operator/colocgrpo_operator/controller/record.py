"""The operator's own record of a job: what it cannot see in the children any more.

Restarts, disruptions, the last failure (with the uid of the Job it ended, so no failure is
counted twice), when the gang first started, and the job's final outcome. The status shows
these, but the status is not where they are kept: each job's trainer may patch the job's status
subresource, and a forged `phase`, `restarts` or `startTime` read back from there would freeze
the job, get around runPolicy.maxRestarts or the active deadline, or let the TTL delete a
running job. The record lives in an annotation on the job's metadata, which the status
subresource cannot change and the trainer's Role cannot patch; only the operator writes it
(users who may edit the job could, as they could edit its spec). docs/decisions.md says why
here and not on the batch Job.

Every job the operator serves gets its record before its first batch Job is created, so no
trainer ever runs without one. A job without a record that already has a status was started by
an operator that kept these in the status: its record is taken from that status, once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from colocgrpo_operator.api import Phase
from colocgrpo_operator.api.naming import RECORD_ANNOTATION

_FINAL_PHASES = (Phase.SUCCEEDED.value, Phase.FAILED.value)
_FAILURE_KEYS = ("reason", "message", "counted", "jobUid", "time", "pod", "exitCode")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the job ended: enough to show its final status when its children are gone."""

    phase: str  # Succeeded or Failed
    reason: str  # the Succeeded/Failed condition's reason
    message: str
    running_reason: str  # the Running condition's last reason and message
    running_message: str


@dataclasses.dataclass(frozen=True)
class Record:
    restarts: int = 0
    disruptions: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    last_failure: dict[str, Any] | None = None
    outcome: Outcome | None = None

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def encode(self) -> str:
        """The annotation's value: compact JSON, keys sorted, empty fields left out."""
        data: dict[str, Any] = {"restarts": self.restarts, "disruptions": self.disruptions}
        if self.start_time:
            data["startTime"] = self.start_time
        if self.completion_time:
            data["completionTime"] = self.completion_time
        if self.last_failure is not None:
            data["lastFailure"] = self.last_failure
        if self.outcome is not None:
            data["outcome"] = {
                "phase": self.outcome.phase,
                "reason": self.outcome.reason,
                "message": self.outcome.message,
                "runningReason": self.outcome.running_reason,
                "runningMessage": self.outcome.running_message,
            }
        return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)

    @classmethod
    def decode(cls, text: Any) -> Record:
        """The record in an annotation's value. Lenient: a field that does not parse is left at its
        default (the value is the operator's, but users who may edit the job can edit it too)."""
        try:
            data = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return cls()
        return cls(
            restarts=_count(data.get("restarts")),
            disruptions=_count(data.get("disruptions")),
            start_time=_text(data.get("startTime")),
            completion_time=_text(data.get("completionTime")),
            last_failure=_failure(data.get("lastFailure")),
            outcome=_outcome(data.get("outcome")),
        )

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> Record:
        """The record an earlier operator kept in the status (a job it started), taken once."""
        outcome = None
        phase = status.get("phase")
        conditions = [c for c in _list(status.get("conditions")) if isinstance(c, dict)]
        by_type = {c.get("type"): c for c in conditions}
        spec_invalid = (by_type.get("SpecValid") or {}).get("reason") == "InvalidSpec"
        if phase in _FINAL_PHASES and not spec_invalid:
            final = by_type.get(phase) or {}
            running = by_type.get("Running") or {}
            outcome = Outcome(
                phase=str(phase),
                reason=_text(final.get("reason")) or ("Completed" if phase == Phase.SUCCEEDED.value else "Error"),
                message=_text(status.get("message")) or str(phase),
                running_reason=_text(running.get("reason")) or str(phase),
                running_message=_text(running.get("message")) or str(phase),
            )
        return cls(
            restarts=_count(status.get("restarts")),
            disruptions=_count(status.get("disruptions")),
            start_time=_text(status.get("startTime")),
            completion_time=_text(status.get("completionTime")) if outcome else None,
            last_failure=_failure(status.get("lastFailure")),
            outcome=outcome,
        )


def record_of(cr: dict[str, Any] | None) -> Record | None:
    """The record on a ColocGRPOJob's metadata; None when it has none yet."""
    annotations = ((cr or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(RECORD_ANNOTATION) if isinstance(annotations, dict) else None
    return None if text is None else Record.decode(text)


@dataclasses.dataclass
class RecordExtras:
    """Annotations a job's first record carries in the same patch (a new job's kopf diff-base,
    handlers.reconcile_job says why); `written` once that patch succeeded."""

    annotations: Mapping[str, Any]
    written: bool = False


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _failure(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {k: value[k] for k in _FAILURE_KEYS if value.get(k) is not None}


def _outcome(value: Any) -> Outcome | None:
    if not isinstance(value, dict) or value.get("phase") not in _FINAL_PHASES:
        return None
    phase = str(value["phase"])
    return Outcome(
        phase=phase,
        reason=_text(value.get("reason")) or phase,
        message=_text(value.get("message")) or phase,
        running_reason=_text(value.get("runningReason")) or phase,
        running_message=_text(value.get("runningMessage")) or phase,
    )
