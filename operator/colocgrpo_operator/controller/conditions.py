"""status.conditions: one condition per type, in the API's order, whose lastTransitionTime
moves only when its status flips.

Every condition is written whole, in the shape of metav1.Condition that the CRD requires (type,
status, reason, message, lastTransitionTime): the status patch replaces the list, so conditions
an older operator left incomplete are rewritten on the next reconcile.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from colocgrpo_operator.api import ConditionType
from colocgrpo_operator.api.model import CONDITION_REASON_PATTERN, MAX_CONDITION_REASON
from colocgrpo_operator.controller.objects import as_list, format_time, truncate

# Condition types, in the order they are listed in status.conditions (the API enum's order).
CONDITION_TYPES = tuple(condition_type.value for condition_type in ConditionType)


_REASON = re.compile(CONDITION_REASON_PATTERN)
_NOT_REASON = re.compile(r"[^A-Za-z0-9_,:]+")


def condition_reason(reason: str) -> str:
    """`reason` as the CRD accepts it. Reasons come from the trainer, the kubelet and the Job controller;
    one the API server would refuse must never block the whole status write."""
    if len(reason) <= MAX_CONDITION_REASON and _REASON.match(reason):
        return reason
    cleaned = _NOT_REASON.sub("", reason).lstrip("0123456789_,:")[:MAX_CONDITION_REASON].rstrip(",:")
    return cleaned or "Unknown"


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with one condition set; lastTransitionTime moves only when status flips."""
    status_text = status if isinstance(status, str) else ("True" if status else "False")
    previous = next((c for c in conditions if isinstance(c, dict) and c.get("type") == type_), None)
    if previous and previous.get("status") == status_text and previous.get("lastTransitionTime"):
        transition = previous["lastTransitionTime"]
    else:
        transition = format_time(now)
    condition = {
        "type": type_,
        "status": status_text,
        "reason": condition_reason(str(reason)),
        "message": truncate(str(message or "")),
        "lastTransitionTime": transition,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == type_)]
    return _ordered([*others, condition])


def _ordered(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def rank(condition: dict[str, Any]) -> int:
        type_ = condition.get("type")
        return CONDITION_TYPES.index(type_) if type_ in CONDITION_TYPES else len(CONDITION_TYPES)

    return sorted((c for c in conditions if isinstance(c, dict)), key=rank)


def condition_of(status: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for condition in as_list((status or {}).get("conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None
