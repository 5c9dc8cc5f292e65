"""What the client reads back from the cluster, as plain values: a job as it stands (`JobState`), its
training progress (`Progress`), one line of a gang's log (`LogLine`).

Pure readers of the API server's JSON: they never call the cluster, and a field the operator or the
trainer has not written yet reads as None, never as an error. `JobState.to_model()` gives the typed
`ColocGRPOJob` when the full model is wanted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colocgrpo_operator.api import ColocGRPOJob

# The phases after which a job never runs again.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _number(value: Any) -> float | None:
    """A finite JSON number as float, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API (`2026-01-02T03:04:05Z`) as an aware datetime; None when absent
    or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def human_duration(seconds: float) -> str:
    """A duration as kubectl's AGE column writes it (`95s`, `3m20s`, `45m`, `3h20m`, `30h`, `3d5h`,
    `45d`, `2y30d`): the precision falls as the duration grows."""
    if seconds < -1:
        return "<invalid>"
    whole = max(int(seconds), 0)
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def age(timestamp: Any, now: datetime | None = None) -> str:
    """How long ago `timestamp` was, as kubectl's AGE column says it; "" when there is none."""
    when = parse_time(timestamp)
    if when is None:
        return ""
    return human_duration(((now or datetime.now(UTC)) - when).total_seconds())


@dataclass(frozen=True)
class Progress:
    """A job's training progress at one moment, as the trainer (rank 0) last reported it and the operator
    phased it. Every number is None until the trainer has reported it."""

    phase: str | None
    step: int | None
    max_steps: int | None
    percent: int | None
    reward: float | None
    metrics: Mapping[str, float] = field(default_factory=dict)
    reward_history: tuple[float, ...] = ()
    estimated_remaining_seconds: int | None = None
    last_update_time: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the job has ended (Succeeded or Failed): no progress comes after this one."""
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class JobState:
    """A ColocGRPOJob as the API server returned it, with readers of what people ask of it.

    `object` is the whole object (metadata, spec, status) as JSON; the properties read it.
    """

    object: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(_dig(self.object, "metadata", "name") or "")

    @property
    def namespace(self) -> str:
        return str(_dig(self.object, "metadata", "namespace") or "")

    @property
    def uid(self) -> str:
        return str(_dig(self.object, "metadata", "uid") or "")

    @property
    def resource_version(self) -> str:
        return str(_dig(self.object, "metadata", "resourceVersion") or "")

    @property
    def created(self) -> datetime | None:
        """metadata.creationTimestamp."""
        return parse_time(_dig(self.object, "metadata", "creationTimestamp"))

    @property
    def deleting(self) -> bool:
        """Whether the job is being deleted (metadata.deletionTimestamp is set)."""
        return bool(_dig(self.object, "metadata", "deletionTimestamp"))

    @property
    def status(self) -> Mapping[str, Any]:
        """status as JSON ({} before the operator first writes it)."""
        status = self.object.get("status")
        return status if isinstance(status, Mapping) else {}

    @property
    def phase(self) -> str | None:
        """status.phase: Pending, Queued, Suspended, Starting, Running, Restarting, Succeeded or Failed;
        None until the operator has seen the job."""
        phase = self.status.get("phase")
        return phase if isinstance(phase, str) and phase else None

    @property
    def message(self) -> str:
        """status.message, the phase in words."""
        return str(self.status.get("message") or "")

    @property
    def finished(self) -> bool:
        """Whether the job has ended: Succeeded or Failed."""
        return self.phase in TERMINAL_PHASES

    @property
    def suspended(self) -> bool:
        """spec.runPolicy.suspend: what the user asked for (the phase says whether the gang has stopped)."""
        return _dig(self.object, "spec", "runPolicy", "suspend") is True

    @property
    def step(self) -> int | None:
        return _integer(_dig(self.status, "progress", "step"))

    @property
    def max_steps(self) -> int | None:
        return _integer(_dig(self.status, "progress", "maxSteps"))

    @property
    def reward(self) -> float | None:
        """The last logged mean reward (status.progress.metrics.reward)."""
        return _number(_dig(self.status, "progress", "metrics", "reward"))

    @property
    def restarts(self) -> int:
        """Whole-gang restarts so far (status.restarts)."""
        return _integer(self.status.get("restarts")) or 0

    @property
    def conditions(self) -> list[Mapping[str, Any]]:
        """status.conditions, in the operator's order."""
        items = self.status.get("conditions")
        return [item for item in items if isinstance(item, Mapping)] if isinstance(items, list) else []

    def condition(self, type_: str) -> Mapping[str, Any] | None:
        """The condition of that type (SpecValid, Queued, Suspended, Running, Stalled, Progressing,
        Succeeded, Failed, PlanWarning), or None when the operator has not set it."""
        return next((item for item in self.conditions if item.get("type") == str(type_)), None)

    def condition_true(self, type_: str) -> bool:
        """Whether the condition of that type is status True (what `kubectl wait --for=condition=` asks)."""
        found = self.condition(type_)
        return found is not None and found.get("status") == "True"

    @property
    def last_failure(self) -> Mapping[str, Any] | None:
        """status.lastFailure: the most recent gang failure as the operator classified it."""
        failure = self.status.get("lastFailure")
        return failure if isinstance(failure, Mapping) and failure else None

    def progress(self) -> Progress:
        """The training progress in this state."""
        progress = self.status.get("progress")
        progress = progress if isinstance(progress, Mapping) else {}
        metrics = progress.get("metrics")
        numbers = {
            str(key): number
            for key, value in (metrics.items() if isinstance(metrics, Mapping) else ())
            if (number := _number(value)) is not None
        }
        history = progress.get("rewardHistory")
        updated = progress.get("lastUpdateTime")
        return Progress(
            phase=self.phase,
            step=self.step,
            max_steps=self.max_steps,
            percent=_integer(progress.get("percent")),
            reward=numbers.get("reward"),
            metrics=numbers,
            reward_history=tuple(
                number
                for value in (history if isinstance(history, list) else [])
                if (number := _number(value)) is not None
            ),
            estimated_remaining_seconds=_integer(progress.get("estimatedRemainingSeconds")),
            last_update_time=updated if isinstance(updated, str) else None,
        )

    def to_model(self) -> ColocGRPOJob:
        """The job as the typed API model (`colocgrpo_operator.api.ColocGRPOJob`), status included.
        Raises pydantic's ValidationError when the stored object does not fit the model (a job the
        API server admitted but the operator refuses: its SpecValid condition says why)."""
        from colocgrpo_operator.api import ColocGRPOJob

        return ColocGRPOJob.model_validate(dict(self.object))


@dataclass(frozen=True)
class LogLine:
    """One line of a gang's log: `text` from the trainer container of `pod`, the pod of `rank`
    (its completion index). A `notice` is the client's own line about the gang (a pod started, ended or
    went away), not the pod's."""

    rank: int | None
    pod: str
    text: str
    notice: bool = False

    def prefixed(self, width: int = 1) -> str:
        """`[rank N] text`, the rank right-aligned in `width` digits (notices: `[rank N] --- text`)."""
        rank = "?" if self.rank is None else str(self.rank)
        return f"[rank {rank:>{width}}] {'--- ' if self.notice else ''}{self.text}"
