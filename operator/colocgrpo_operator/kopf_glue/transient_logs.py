"""kopf's lines about transient API failures, as one-line WARNINGs.

kopf retries its own requests and watches when the API server is briefly away, and logs each
attempt at ERROR, with a traceback when it gives up (and then starts the watch or patch over).
Such a failure is one WARNING line here, as the operator's own retries are (kube/transient.py):
ERROR is kept for what a human must act on.
"""

from __future__ import annotations

import logging

import aiohttp
from kopf._cogs.clients.errors import APIServerError, APITooManyRequestsError

from colocgrpo_operator.kube.transient import describe, is_transient

# kopf's own lines about a request it is about to retry (kopf._cogs.clients.api.request).
_KOPF_RETRY_MARKS = (
    "failed; will retry",
    "failed; TCP closed; will re-authenticate",
    "SSL closed; will re-authenticate",
)
# Transient failures of kopf's own requests (its aiohttp session), besides the client's own.
_KOPF_TRANSIENT = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    APIServerError,  # kopf's 5xx
    APITooManyRequestsError,  # kopf's 429
)


def is_transient_for_kopf(error: BaseException) -> bool:
    """`is_transient` (kube/transient.py), kopf's session's and API errors included."""
    return is_transient(error) or isinstance(error, _KOPF_TRANSIENT)


class TransientApiLogFilter(logging.Filter):
    """Turns kopf's ERROR lines about transient API failures into one-line WARNINGs: its "Request
    attempt ... failed; will retry" lines, and any line whose exception is transient (a watch
    or patch that gave up after its retries: kopf starts it over). Every other line is passed on
    as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith("kopf"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        if (error is not None and is_transient_for_kopf(error)) or any(mark in message for mark in _KOPF_RETRY_MARKS):
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            if error is not None:
                record.msg, record.args = f"{message.splitlines()[0]} ({describe(error)})", None
            record.exc_info = record.exc_text = record.stack_info = None
        return True


def install_log_filter() -> None:
    """Put `TransientApiLogFilter` on every handler of the root logger (once): kopf logs through
    many loggers, and a handler's filter sees them all."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, TransientApiLogFilter) for f in handler.filters):
            handler.addFilter(TransientApiLogFilter())
