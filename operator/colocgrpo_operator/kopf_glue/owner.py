"""A job as kopf knows its owner: the Events the reconciler posts about it, its children adopted.

The reconciler (controller/reconciler.py) imports no kopf: the operator hands it these two
(`OperatorRuntime.open`), its `post_event` and its `adopt`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

# An Event's message is cut to its first this many characters (kopf's poster would keep both ends
# of a longer one, its middle cut out).
MAX_EVENT_MESSAGE = 1024

log = logging.getLogger("colocgrpo.operator")


def owner_body(job: Mapping[str, Any]) -> kopf.Body:
    """The job as kopf's Events and owner references need it: its identity, nothing else."""
    meta = job.get("metadata") or {}
    return kopf.Body(
        kopf.RawBody(
            apiVersion=job.get("apiVersion") or "colocgrpo.io/v1alpha1",
            kind=job.get("kind") or "ColocGRPOJob",
            metadata={
                "name": str(meta.get("name") or ""),
                "namespace": str(meta.get("namespace") or ""),
                "uid": str(meta.get("uid") or ""),
                "labels": dict(meta.get("labels") or {}),
            },
        )
    )


def post_event(job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post an Event about `job` through kopf's poster (in the background, retried by kopf).
    Outside a kopf handler's context there is no posting queue: no Event, the status is enough."""
    try:
        kopf.event(owner_body(job), type=type_, reason=reason, message=message[:MAX_EVENT_MESSAGE])
    except LookupError:  # outside kopf's handler context (no posting queue)
        meta = job.get("metadata") or {}
        log.debug("no event posted for %s/%s: outside a handler context", meta.get("namespace"), meta.get("name"))


def adopt(children: list[dict[str, Any]], job: Mapping[str, Any]) -> None:
    """Make `children` the job's own, in place (`kopf.adopt`): the job as their controller owner
    (blocking its deletion), its namespace and its labels where a child has none of its own."""
    kopf.adopt(children, owner=owner_body(job))
