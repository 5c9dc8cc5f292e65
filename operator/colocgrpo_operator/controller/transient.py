"""Transient API failures: which they are, and how they are logged.

The API server restarting, a load balancer dropping a connection, API Priority and Fairness
shedding load: a request fails, and the same request a moment later succeeds. The operator retries
its own reconciles with backoff (`ReconcileScheduler`), and kopf retries its own requests and
watches. Either way such a failure is one WARNING line, never an ERROR and never a traceback:
ERROR is kept for what a human must act on.
"""

from __future__ import annotations

import http.client
import logging

import aiohttp
import urllib3
from kopf._cogs.clients.errors import APIServerError, APITooManyRequestsError

from colocgrpo_operator.controller.kube import KubeApiError

# kopf's own lines about a request it is about to retry (kopf._cogs.clients.api.request).
_KOPF_RETRY_MARKS = (
    "failed; will retry",
    "failed; TCP closed; will re-authenticate",
    "SSL closed; will re-authenticate",
)


def is_transient(error: BaseException) -> bool:
    """Whether `error` is an API failure that the same request, a moment later, may not meet:
    the connection refused, reset or timed out, an answer cut short, a 5xx, a 429."""
    if isinstance(error, KubeApiError):
        return error.status == 429 or error.status >= 500
    return isinstance(
        error,
        (
            urllib3.exceptions.HTTPError,  # refused, reset, timed out, cut short, TLS torn down
            http.client.HTTPException,  # RemoteDisconnected, IncompleteRead
            ConnectionError,
            TimeoutError,
            aiohttp.ClientConnectionError,  # kopf's session
            aiohttp.ClientPayloadError,
            APIServerError,  # kopf's 5xx
            APITooManyRequestsError,  # kopf's 429
        ),
    )


def describe(error: BaseException) -> str:
    """`error` in one short line (no traceback, no nested reprs of urllib3's pools)."""
    if isinstance(error, KubeApiError):
        return f"{error.status} {error.reason}: {error.message}"[:300]
    cause: BaseException = error
    while isinstance(cause, urllib3.exceptions.HTTPError) and cause.__context__ is not None:
        cause = cause.__context__  # the socket's own error says more than urllib3's wrapper
    text = str(cause).splitlines()[0] if str(cause) else ""
    return f"{type(cause).__name__}: {text}"[:300] if text else type(cause).__name__


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
        if (error is not None and is_transient(error)) or any(mark in message for mark in _KOPF_RETRY_MARKS):
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
