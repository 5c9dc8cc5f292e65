"""Progress reporting: rank 0 patches `status.progress` of its ColocGRPOJob.

The trainer owns only `status.progress` (the operator owns the rest of status), so the
patch sets that one subtree through the status subresource, with the job's own
ServiceAccount (in-cluster) or KUBECONFIG on a host; it is refused once the job is another
incarnation than the one the config was rendered for (`JobRef.progress_patch`). Patches are rate-limited
(`progress.min_interval_seconds`; the final step always goes out). Every report is also
printed as one JSON line on stdout, so `kubectl logs` shows the same numbers.

Reporting must never stop training: API errors are logged and retried with backoff.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from colocgrpo_training.config import JobRef, ProgressSettings
from colocgrpo_training.console import say_line

log = logging.getLogger(__name__)

GROUP = "colocgrpo.io"
VERSION = "v1alpha1"
PLURAL = "colocgrpojobs"

# TRL's log keys → the names in status.progress.metrics.
_METRIC_NAMES = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "loss": "loss",
    "completions/mean_length": "completion_length",
    "completions/clipped_ratio": "completion_clipped_ratio",
    "entropy": "entropy",
    "learning_rate": "learning_rate",
    "grad_norm": "grad_norm",
    "frac_reward_zero_std": "frac_reward_zero_std",
    # The colocated vLLM's running totals for this process (generation/vllm_engine.py): the operator exports
    # them per job, and the dashboard splits the step time by them.
    "generation/sleep_seconds": "sleep_seconds_total",
    "generation/wake_seconds": "wake_seconds_total",
    "generation/push_seconds": "push_seconds_total",
    "generation/generate_seconds": "generate_seconds_total",
}
# status.progress.rewardHistory holds this many of the latest logged rewards (the API's bound).
REWARD_HISTORY = 40
_MAX_BACKOFF_SECONDS = 300.0
_REQUEST_TIMEOUT_SECONDS = 10


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def rfc3339_now() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


def estimate(step: int, max_steps: int, steps_run: int, seconds_run: float) -> tuple[int | None, int | None]:
    """(percent, estimated remaining seconds): the percent of max_steps done, rounded down, and the steps left
    at the mean pace of the `steps_run` steps this process ran in `seconds_run` (None before the first one)."""
    if max_steps <= 0:
        return None, None
    percent = max(0, min(100, (100 * step) // max_steps))
    if step >= max_steps:
        return percent, 0
    if steps_run <= 0 or seconds_run <= 0:
        return percent, None
    return percent, max(0, round((max_steps - step) * seconds_run / steps_run))


def progress_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """TRL's logged values → our metric names; per-reward means keep TRL's `rewards/<name>/mean` key."""
    metrics: dict[str, float] = {}
    for key, value in logs.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue  # JSON has no NaN; an all-None reward batch logs nothing rather than NaN
        if key in _METRIC_NAMES:
            metrics[_METRIC_NAMES[key]] = float(value)
        elif key.startswith("rewards/") and key.endswith("/mean"):
            metrics[key] = float(value)
    return metrics


def load_kube_client() -> Any | None:
    """A CustomObjectsApi from in-cluster config, else KUBECONFIG / ~/.kube/config, else None."""
    try:
        from kubernetes import client, config
    except ImportError:
        log.warning("kubernetes client not installed; progress is only printed")
        return None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            return None
        try:
            config.load_kube_config(config_file=kubeconfig)
        except Exception as err:
            log.warning("cannot load KUBECONFIG %s (%s); progress is only printed", kubeconfig, err)
            return None
    return client.CustomObjectsApi()


class StatusPatcher:
    """Patches status.progress; remembers failures and backs off instead of raising."""

    def __init__(self, job: JobRef, api: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.api = api
        self.clock = clock
        self.failures = 0
        self.retry_at = 0.0

    def can_try(self) -> bool:
        return self.clock() >= self.retry_at

    def patch(self, progress: dict[str, Any]) -> bool:
        # Bound to the job's incarnation when the config names its uid (JobRef.progress_patch).
        body, content_type = self.job.progress_patch(progress)
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.job.namespace,
                PLURAL,
                self.job.name,
                body,
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
                _content_type=content_type,
            )
        except Exception as err:  # unreachable API, 403, 404: all must leave training running
            self.failures += 1
            delay = min(_MAX_BACKOFF_SECONDS, 2.0 ** min(self.failures, 9))
            self.retry_at = self.clock() + delay
            log.warning(
                "could not patch status.progress of %s/%s (%s); retrying in %.0f s",
                self.job.namespace,
                self.job.name,
                _short(err),
                delay,
            )
            return False
        self.failures = 0
        self.retry_at = 0.0
        return True


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:200]


class BackgroundSender:
    """Sends patches from a daemon thread so a slow or black-holed API server never blocks a step.

    Holds at most one pending report: a newer one replaces it (only the latest progress matters).
    """

    def __init__(self, patcher: StatusPatcher) -> None:
        self.patcher = patcher
        self.sent = 0
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="colocgrpo-progress", daemon=True)
        self._thread.start()

    def submit(self, progress: dict[str, Any]) -> None:
        with self._lock:
            self._pending = progress
            self._lock.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending or in flight; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending is not None or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._pending is None:
                    self._lock.wait()
                progress, self._pending, self._busy = self._pending, None, True
            ok = self.patcher.patch(progress)
            with self._lock:
                self.sent += int(ok)
                self._busy = False
                self._lock.notify_all()


class ProgressReporter(TrainerCallback):
    """TrainerCallback; acts only on the world's process zero."""

    def __init__(
        self,
        job: JobRef,
        settings: ProgressSettings,
        patcher: StatusPatcher | None = None,
        stream: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.settings = settings
        self.patcher = patcher
        self.stream = stream
        self.clock = clock
        self.metrics: dict[str, float] = {}
        self.last_checkpoint: str | None = None
        self.last_patch_at: float | None = None
        self._step_started: float | None = None
        # The pace of this process: steps since its first step began (a resumed run starts past 0).
        self._first_step: tuple[int, float] | None = None
        self.reward_history: list[float] = []
        self.sender = BackgroundSender(patcher) if patcher is not None else None

    @property
    def patches_sent(self) -> int:
        return self.sender.sent if self.sender is not None else 0

    def flush(self, timeout: float = 15.0) -> bool:
        return self.sender.flush(timeout) if self.sender is not None else True

    @classmethod
    def from_settings(cls, job: JobRef, settings: ProgressSettings) -> ProgressReporter:
        patcher = None
        if settings.patch_status:
            api = load_kube_client()
            if api is not None:
                patcher = StatusPatcher(job, api)
            else:
                log.info("no in-cluster config or KUBECONFIG: progress is printed, not patched")
        return cls(job, settings, patcher)

    # -- callback hooks -------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # Tells the operator early that training started (and where a resumed run stands).
        if state.is_world_process_zero:
            self.report(state, final=False)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step_started = self.clock()
        if self._first_step is None:
            self._first_step = (int(state.global_step), self._step_started)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._step_started is not None:
            self.metrics["step_time_seconds"] = round(self.clock() - self._step_started, 4)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        if "train_runtime" in logs:  # the end-of-training summary, not a step
            return
        logged = progress_metrics(logs)
        self.metrics.update(logged)
        if "reward" in logged:
            self.reward_history = [*self.reward_history, round(logged["reward"], 6)][-REWARD_HISTORY:]
        self.report(state, final=state.global_step >= state.max_steps > 0)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        assert args.output_dir is not None  # TrainingArguments.__post_init__ fills in a default
        self.last_checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.report(state, final=False)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero:
            self.report(state, final=True)
            if not self.flush():  # the last report matters most; bounded, never fatal
                log.warning("final status.progress patch still pending after 15 s; giving up on it")

    # -- reporting ------------------------------------------------------------------------

    def snapshot(self, state: TrainerState) -> dict[str, Any]:
        step, max_steps = int(state.global_step), int(state.max_steps)
        now = dt.datetime.now(dt.UTC)
        progress: dict[str, Any] = {
            "step": step,
            "maxSteps": max_steps,
            "metrics": dict(self.metrics),
            "lastUpdateTime": rfc3339(now),
        }
        first_step, started = self._first_step or (step, self.clock())
        percent, remaining = estimate(step, max_steps, step - first_step, self.clock() - started)
        if percent is not None:
            progress["percent"] = percent
        if remaining is not None:
            progress["estimatedRemainingSeconds"] = remaining
            progress["estimatedCompletionTime"] = rfc3339(now + dt.timedelta(seconds=remaining))
        if self.reward_history:
            progress["rewardHistory"] = list(self.reward_history)
        if self.last_checkpoint is not None:
            progress["lastCheckpoint"] = self.last_checkpoint
        return progress

    def report(self, state: TrainerState, *, final: bool) -> None:
        progress = self.snapshot(state)
        stream = self.stream or sys.stdout
        say_line(json.dumps({"progress": progress}, sort_keys=True), stream)  # one write: the ranks share stdout
        if self.sender is None or self.patcher is None:
            return
        now = self.clock()
        due = final or self.last_patch_at is None or now - self.last_patch_at >= self.settings.min_interval_seconds
        if not due or not (final or self.patcher.can_try()):
            return
        self.last_patch_at = now
        self.sender.submit(progress)
