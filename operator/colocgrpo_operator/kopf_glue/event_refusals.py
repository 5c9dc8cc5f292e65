"""kopf's lines about an Event that a terminating namespace refuses are kept at DEBUG.

The operator posts its Events about a job through kopf's poster, which sends them in the
background and retries a refused one with backoff, logging every attempt (WARNING, then ERROR
when it gives up, then a WARNING "Failed to post an event"). A namespace being deleted refuses
every new object, Events included, with a 403 "... because it is being terminated". The
reconciler posts nothing for a job whose namespace it knows to be terminating
(`Reconciler._namespace_going`), but a teardown that starts between a new job's first status
write and its Event cannot be seen coming: `TerminatingNamespaceEventFilter` keeps kopf's lines
about such an Event at DEBUG. Any other failure to post an Event is logged as kopf logs it.
"""

from __future__ import annotations

import logging

# kopf._core.engines.posting's logger: its retries of each Event, and the line when it gives up.
_KOPF_LOGGER = "kopf._core.engines.posting"
# The API server's words (NamespaceLifecycle admission) for a create in a namespace being deleted.
_TERMINATING = "because it is being terminated"


class TerminatingNamespaceEventFilter(logging.Filter):
    """On kopf's posting logger: a line about an Event refused because its namespace is being
    deleted becomes DEBUG (kept only where DEBUG is logged); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or _TERMINATING not in record.getMessage():
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        record.exc_info = record.exc_text = None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install_event_refusal_filter() -> None:
    """Put one `TerminatingNamespaceEventFilter` on kopf's posting logger (later calls do nothing)."""
    kopf_logger = logging.getLogger(_KOPF_LOGGER)
    if not any(isinstance(f, TerminatingNamespaceEventFilter) for f in kopf_logger.filters):
        kopf_logger.addFilter(TerminatingNamespaceEventFilter())
