"""The operator's own record of a job: what it cannot see in the children any more.

Restarts, disruptions, the last failure (with the uid of the Job it ended, so no failure is
counted twice), when the gang first started, the job's final outcome, and the runtime its current
gang was made from (its spec as it was then: a runtime edited later reaches the job only at its
next gang restart). The status shows
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
class RuntimeSnapshot:
    """The (Cluster)ColocGRPORuntime a job's gang was made from, as it was then: which object
    (kind, name, uid, generation) and its spec, which the job's spec is merged with for as long
    as that gang runs."""

    kind: str
    name: str
    uid: str | None
    generation: int | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, runtime_obj: Mapping[str, Any]) -> RuntimeSnapshot:
        """The snapshot of a runtime object as the API server returned it."""
        meta = runtime_obj.get("metadata") or {}
        return cls(
            kind=str(runtime_obj.get("kind") or ""),
            name=str(meta.get("name") or ""),
            uid=_text(meta.get("uid")),
            generation=_count(meta.get("generation")) or None,
            spec=dict(runtime_obj.get("spec") or {}),
        )

    def same_object(self, other: RuntimeSnapshot | None) -> bool:
        """Whether `other` is this very runtime at this very generation."""
        return other is not None and (self.kind, self.name, self.uid, self.generation) == (
            other.kind,
            other.name,
            other.uid,
            other.generation,
        )

    def as_object(self, namespace: str | None) -> dict[str, Any]:
        """The runtime object again, for the merge (api/runtime.py, `resolve_job`)."""
        meta: dict[str, Any] = {"name": self.name, "uid": self.uid, "generation": self.generation}
        if namespace is not None:
            meta["namespace"] = namespace
        return {"kind": self.kind, "metadata": meta, "spec": self.spec}

    def status(self) -> dict[str, Any]:
        """status.runtime: kind, name and generation."""
        shown: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.generation is not None:
            shown["generation"] = self.generation
        return shown

    def encode(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class Record:
    restarts: int = 0
    disruptions: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    last_failure: dict[str, Any] | None = None
    outcome: Outcome | None = None
    runtime: RuntimeSnapshot | None = None

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
        if self.runtime is not None:
            data["runtime"] = self.runtime.encode()
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
            runtime=_runtime(data.get("runtime")),
        )

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> Record:
        """The record an earlier operator kept in the status (a job it started), taken once."""
        outcome = None
        phase = status.get("phase")
        conditions = [c for c in _list(status.get("conditions")) if isinstance(c, dict)]
        by_type = {c.get("type"): c for c in conditions}
        # A refused spec (InvalidSpec, or RuntimeNotFound) is not an outcome: fixing it revives the job.
        spec_valid = by_type.get("SpecValid") or {}
        spec_invalid = spec_valid.get("status") == "False" or spec_valid.get("reason") == "InvalidSpec"
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


def _runtime(value: Any) -> RuntimeSnapshot | None:
    if not isinstance(value, dict) or not _text(value.get("kind")) or not _text(value.get("name")):
        return None
    spec = value.get("spec")
    return RuntimeSnapshot(
        kind=value["kind"],
        name=value["name"],
        uid=_text(value.get("uid")),
        generation=_count(value.get("generation")) or None,
        spec=spec if isinstance(spec, dict) else {},
    )


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
