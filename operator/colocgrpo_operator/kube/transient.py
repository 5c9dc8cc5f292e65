"""Transient API failures of the client: which they are, and how they read in one line.

The API server restarting, a load balancer dropping a connection, API Priority and Fairness
shedding load: a request fails, and the same request a moment later succeeds. The operator retries
its own reconciles with backoff (`ReconcileScheduler`), and kopf retries its own requests and
watches (whose lines about them are rewritten by kopf_glue/transient_logs.py). Either way such a
failure is one WARNING line, never an ERROR and never a traceback: ERROR is kept for what a human
must act on.
"""

from __future__ import annotations

import http.client

import urllib3

from colocgrpo_operator.kube.client import KubeApiError


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
