"""Prometheus metrics of the operator (served on --metrics-port, path /metrics).

Every metric of the operator's own starts with `colocgrpo_` (the client library's standard
`process_*` and `python_*` collectors keep their usual names). Per-job series carry two labels,
`namespace` and `job_name`, both bounded by the jobs that exist: `JobMetrics` keeps one sample per
job, taken from the job's own watch events, and drops it when the job is deleted, so a scrape
never shows a job that is gone. The label is `job_name`, not `job`: Prometheus gives every scraped
series a `job` label of its own (the scrape job) and would rename ours to `exported_job`.

One module for every part of the operator (the client counts its requests, the Lease holder says so,
the reconciler counts restarts, the handlers keep the per-job samples): it imports nothing of the
operator but api/, so each of them may import it.
"""

from __future__ import annotations

import math
import platform
import struct
import threading
from collections import Counter as _Tally
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from colocgrpo_operator import __version__
from colocgrpo_operator.api import Phase

PHASES = tuple(phase.value for phase in Phase)

BUILD_INFO = Gauge(
    "colocgrpo_build_info",
    "The running operator's version (always 1)",
    ["version", "python"],
)
BUILD_INFO.labels(version=__version__, python=platform.python_version()).set(1)
JOBS_BY_PHASE = Gauge("colocgrpo_jobs", "ColocGRPOJobs known to the operator, by phase", ["phase"])
RECONCILE_SECONDS = Histogram(
    "colocgrpo_reconcile_duration_seconds",
    "Time to reconcile one ColocGRPOJob (status derivation and the API calls it needed)",
    ["trigger"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("colocgrpo_reconcile_errors_total", "Reconciles that raised", ["trigger"])
GANG_RESTARTS = Counter("colocgrpo_gang_restarts_total", "Whole-gang restarts", ["counted"])
PROGRESS_DEADLINES = Counter(
    "colocgrpo_progress_deadline_exceeded_total",
    "Running gangs whose training step did not advance within runPolicy.progressDeadlineSeconds",
)
API_REQUESTS = Counter(
    "colocgrpo_api_requests_total",
    "Kubernetes API requests made by the handlers (kopf's own watches and patches not included)",
    ["verb"],
)
API_RETRIES = Counter(
    "colocgrpo_api_retries_total",
    "Kubernetes API requests sent again: after a 401 with a refreshed token, or after a 429 (throttled)",
    ["reason"],
)

LEADER = Gauge(
    "colocgrpo_leader",
    "1 on the replica that holds the leader-election Lease and reconciles, 0 on a standby",
)


class PhaseBook:
    """The last phase of every job, so the phase gauge is exact (not a running sum)."""

    def __init__(self) -> None:
        self._phases: dict[Any, str] = {}
        self._counts: _Tally[str] = _Tally()
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


# ----------------------------------------------------------------------------- per job


class JobSample(NamedTuple):
    """What a job's status says, as numbers (None where it says nothing)."""

    step: float | None
    max_steps: float | None
    reward: float | None
    step_seconds: float | None
    restarts: float | None
    gpus: float | None
    sleep_seconds: float | None
    wake_seconds: float | None
    push_seconds: float | None
    generate_seconds: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sample_of(status: Mapping[str, Any] | None) -> JobSample:
    """The numbers of one job's status (the operator's part and the trainer's progress); anything
    malformed (the trainer writes progress) is left out rather than trusted."""
    status = _mapping(status)
    progress = _mapping(status.get("progress"))
    metrics = _mapping(progress.get("metrics"))
    workers = _mapping(status.get("workers"))
    return JobSample(
        step=_number(progress.get("step")),
        max_steps=_number(progress.get("maxSteps")),
        reward=_number(metrics.get("reward")),
        step_seconds=_number(metrics.get("step_time_seconds")),
        restarts=_number(status.get("restarts")),
        gpus=_number(workers.get("gpus")),
        sleep_seconds=_number(metrics.get("sleep_seconds_total")),
        wake_seconds=_number(metrics.get("wake_seconds_total")),
        push_seconds=_number(metrics.get("push_seconds_total")),
        generate_seconds=_number(metrics.get("generate_seconds_total")),
    )


# (field of JobSample, metric name, help, counter?) in the order they are exposed.
JOB_SERIES = (
    (
        "step",
        "colocgrpo_job_step",
        "Optimizer steps the job's trainer has done (status.progress.step)",
        False,
    ),
    (
        "max_steps",
        "colocgrpo_job_max_steps",
        "Optimizer steps of the whole run (status.progress.maxSteps)",
        False,
    ),
    (
        "reward",
        "colocgrpo_job_reward",
        "The latest logged reward (status.progress.metrics.reward)",
        False,
    ),
    (
        "step_seconds",
        "colocgrpo_job_step_seconds",
        "Wall time of the latest training step (status.progress.metrics.step_time_seconds)",
        False,
    ),
    (
        "gpus",
        "colocgrpo_job_gpus",
        "GPUs held by the job's active pods (status.workers.gpus)",
        False,
    ),
    (
        "restarts",
        "colocgrpo_job_restarts",
        "Whole-gang restarts counted against maxRestarts (status.restarts)",
        True,
    ),
    (
        "sleep_seconds",
        "colocgrpo_job_sleep_seconds",
        "Time rank 0 spent putting vLLM to sleep, in its current process",
        True,
    ),
    (
        "wake_seconds",
        "colocgrpo_job_wake_seconds",
        "Time rank 0 spent waking vLLM, in its current process",
        True,
    ),
    (
        "push_seconds",
        "colocgrpo_job_push_seconds",
        "Time rank 0 spent pushing the weights into vLLM, in its current process",
        True,
    ),
    (
        "generate_seconds",
        "colocgrpo_job_generate_seconds",
        "Time rank 0 spent generating with vLLM, in its current process",
        True,
    ),
)
JOB_LABELS = ("namespace", "job_name")


_PACKED = struct.Struct(f"<{len(JobSample._fields)}d")


def _pack(sample: JobSample) -> bytes:
    return _PACKED.pack(*(math.nan if value is None else value for value in sample))


def _unpack(packed: bytes) -> JobSample:
    return JobSample(*(None if math.isnan(value) else value for value in _PACKED.unpack(packed)))


class JobMetrics(Collector):
    """One sample per job, exposed at scrape time (the scrape runs in the metrics server's thread,
    the samples change on the event loop: a lock keeps the two apart).

    A sample is kept packed in one bytes object, and replaced only when it changed: samples outlive
    the bursts of watch events they are taken in, and a dozen small objects per job, scattered
    among a burst's freed ones, would keep the allocator from returning those pages (the same
    reason the indices hold packed views, controller/snapshots.py)."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], bytes] = {}
        self._lock = threading.Lock()

    def observe(self, key: tuple[str, str], status: Mapping[str, Any] | None) -> None:
        packed = _pack(sample_of(status))
        with self._lock:
            if self._samples.get(key) != packed:
                self._samples[key] = packed

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._samples.pop(key, None)

    def __len__(self) -> int:
        return len(self._samples)

    def describe(self) -> Iterator[Metric]:
        for _field, name, help_text, counter in JOB_SERIES:
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(name, help_text, labels=JOB_LABELS)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples = [(key, _unpack(packed)) for key, packed in self._samples.items()]
        for field, name, help_text, counter in JOB_SERIES:
            family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, help_text, labels=JOB_LABELS)
            for (namespace, job), sample in samples:
                value = getattr(sample, field)
                if value is not None:
                    family.add_metric([namespace, job], value)
            yield family


JOB_METRICS = JobMetrics()
REGISTRY.register(JOB_METRICS)


_SERVERS: dict[int, Any] = {}


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve /metrics in a daemon thread; returns the server (shutdown() stops it). Started once
    per port: `colocgrpo-operator` starts it before leader election (a standby has metrics too),
    the startup handler gets the same one."""
    if port in _SERVERS:
        return _SERVERS[port]
    for name in PHASES:
        JOBS_BY_PHASE.labels(phase=name).set(0)
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    _SERVERS[port] = server
    return server
