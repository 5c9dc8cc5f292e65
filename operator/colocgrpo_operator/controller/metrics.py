"""Prometheus metrics of the operator (served on --metrics-port, path /metrics)."""

from __future__ import annotations

import threading
from collections import Counter as _Tally
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

from colocgrpo_operator.api import Phase

PHASES = tuple(phase.value for phase in Phase)

JOBS_BY_PHASE = Gauge("colocgrpo_jobs", "ColocGRPOJobs known to the operator, by phase", ["phase"])
RECONCILE_SECONDS = Histogram(
    "colocgrpo_reconcile_duration_seconds",
    "Time to reconcile one ColocGRPOJob (status derivation and the API calls it needed)",
    ["trigger"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("colocgrpo_reconcile_errors_total", "Reconciles that raised", ["trigger"])
GANG_RESTARTS = Counter("colocgrpo_gang_restarts_total", "Whole-gang restarts", ["counted"])
API_REQUESTS = Counter(
    "colocgrpo_operator_api_requests_total",
    "Kubernetes API requests made by the handlers (kopf's own watches and patches not included)",
    ["verb"],
)
API_RETRIES = Counter(
    "colocgrpo_operator_api_retries_total",
    "Kubernetes API requests sent again: after a 401 with a refreshed token, or after a 429 (throttled)",
    ["reason"],
)

LEADER = Gauge(
    "colocgrpo_operator_leader",
    "1 on the replica that holds the leader-election Lease and reconciles, 0 on a standby",
)


class PhaseBook:
    """The last phase of every job, so the phase gauge is exact (not a running sum)."""

    def __init__(self) -> None:
        self._phases: dict[Any, str] = {}
        self._counts: _Tally = _Tally()
        self._lock = threading.Lock()

    def set(self, key: Any, phase: str | None) -> None:
        with self._lock:
            old = self._phases.get(key)
            if old == phase:
                return
            if old is not None:
                self._counts[old] -= 1
                JOBS_BY_PHASE.labels(phase=old).set(self._counts[old])
            if phase is None:
                self._phases.pop(key, None)
                return
            self._phases[key] = phase
            self._counts[phase] += 1
            JOBS_BY_PHASE.labels(phase=phase).set(self._counts[phase])


_SERVERS: dict[int, Any] = {}


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve /metrics in a daemon thread; returns the server (shutdown() stops it). Started once
    per port: `colocgrpo operator` starts it before leader election (a standby has metrics too),
    the startup handler gets the same one."""
    if port in _SERVERS:
        return _SERVERS[port]
    for name in PHASES:
        JOBS_BY_PHASE.labels(phase=name).set(0)
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    _SERVERS[port] = server
    return server
