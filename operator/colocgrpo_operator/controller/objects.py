"""Small readers of Kubernetes objects and timestamps, shared by status derivation.

What the API server hands back was written by others (the Job controller, the kubelet, the
trainer), so nothing here assumes a field is present or has the right type: a reader returns
a default rather than raising.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from colocgrpo_operator.api.naming import COMPLETION_INDEX_KEY

MAX_MESSAGE = 2000


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes timestamps."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A Kubernetes timestamp (or None for anything unparseable: status is never trusted blindly)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def dig(obj: Any, *path: str, default: Any = None) -> Any:
    """obj[path[0]][path[1]]..., or `default` where a level is missing, None or not a dict."""
    for key in path:
        if not isinstance(obj, dict):
            return default
        obj = obj.get(key)
    return default if obj is None else obj


def as_list(value: Any) -> list[Any]:
    """The value if it is a list (status written by others is never trusted to be well-formed)."""
    return value if isinstance(value, list) else []


def truncate(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def job_condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The batch Job's condition of this type if it is True, else None."""
    for condition in as_list(dig(job, "status", "conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def pod_condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in as_list(dig(pod, "status", "conditions")):
        if isinstance(condition, dict) and condition.get("type") == type_:
            return condition
    return None


def container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Init containers' statuses, then the containers'."""
    statuses = as_list(dig(pod, "status", "initContainerStatuses")) + as_list(dig(pod, "status", "containerStatuses"))
    return [s for s in statuses if isinstance(s, dict)]


def pods_of_job(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of this very Job (by owner uid): pods of a deleted predecessor do not count."""
    uid = dig(job, "metadata", "uid")
    if not uid:
        return []
    owned = []
    for pod in pods:
        owners = as_list(dig(pod, "metadata", "ownerReferences"))
        if any(isinstance(o, dict) and o.get("uid") == uid for o in owners):
            owned.append(pod)
    return owned


def owned_by(obj: dict[str, Any], uid: str | None) -> bool:
    """Whether `obj` belongs to the owner `uid`: it names that owner, or none at all."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return not owners or any(isinstance(o, dict) and o.get("uid") == uid for o in owners)


def completion_index(pod: dict[str, Any]) -> int | None:
    value = dig(pod, "metadata", "labels", COMPLETION_INDEX_KEY)
    if value is None:
        value = dig(pod, "metadata", "annotations", COMPLETION_INDEX_KEY)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
