"""`OperatorConfig`: everything `colocgrpo-operator` can be told, in one frozen object.

Built once from the command line (cli/operator.py), validated there, and handed to kopf's
startup handler in kopf's memo (`kopf.run(memo=kopf.Memo(config=...))`); nothing reads the
environment or a module global for it afterwards. Every field is a flag of `colocgrpo-operator`
(`FLAGS`), and a bad value fails before the operator starts, with an error naming the flag.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from colocgrpo_operator.api.model import IMAGE_REFERENCE_PATTERN

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# The flag of `colocgrpo-operator` that sets each field (for help texts and error messages).
FLAGS = {
    "namespaces": "--namespace",
    "trainer_image": "--trainer-image",
    "metrics_port": "--metrics-port",
    "liveness_port": "--liveness-port",
    "recheck_seconds": "--recheck-seconds",
    "api_threads": "--api-threads",
    "kopf_connections": "--kopf-connections",
    "kubeconfig": "--kubeconfig",
    "log_level": "--log-level",
    "leader_election": "--leader-election",
    "leader_election_namespace": "--leader-election-namespace",
    "leader_election_name": "--leader-election-name",
    "lease_duration": "--lease-duration",
    "renew_deadline": "--renew-deadline",
    "retry_period": "--retry-period",
}

# kopf's HTTP session bound (see `OperatorConfig.kopf_connection_limit`).
WATCH_CONNECTIONS_PER_NAMESPACE = 5  # ColocGRPOJobs, Jobs, pods, Kueue Workloads, and a spare
OBSERVER_CONNECTIONS = 2  # kopf's CRD and namespace observers
_GLOB_CHARACTERS = "*?[!"


class ConfigError(ValueError):
    """A setting the operator cannot run with. `flag` names the command-line flag that sets it;
    `str(error)` reads `--flag: what is wrong`."""

    def __init__(self, flag: str, problem: str):
        self.flag = flag
        self.problem = problem
        super().__init__(f"{flag}: {problem}")


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """The operator's settings; the defaults are those of `colocgrpo-operator` without flags.

    Construction validates every field and raises `ConfigError` (naming the flag) for the first
    bad one, so an `OperatorConfig` that exists is one the operator can run with.
    """

    namespaces: tuple[str, ...] = ()
    """Namespaces (or glob patterns) to watch; empty: every namespace (cluster-wide)."""
    trainer_image: str | None = None
    """Trainer image for jobs whose spec names none; None: the renderer's default for this version."""
    metrics_port: int = 9090
    """Port of the Prometheus /metrics endpoint; 0 switches it off."""
    liveness_port: int = 8080
    """Port of the probes (liveness /healthz, readiness /readyz; kopf_glue/health.py); 0 switches them off."""
    recheck_seconds: float = 10.0
    """Period of the housekeeping loop's re-check of active jobs (stall detection granularity)."""
    api_threads: int = 16
    """Executor threads for the operator's blocking API calls, and its connection pool size."""
    kopf_connections: int = 8
    """kopf's working HTTP connections on top of its watch streams; 0: unbounded (kopf's default)."""
    kubeconfig: str | None = None
    """Kubeconfig file; None: the pod's ServiceAccount when in a pod, else $KUBECONFIG or ~/.kube/config."""
    log_level: str = "INFO"
    """One of LOG_LEVELS."""
    leader_election: bool = False
    """Reconcile only while holding a coordination.k8s.io Lease; stand by otherwise (kube/leadership.py)."""
    leader_election_namespace: str | None = None
    """Namespace of the Lease; None: $POD_NAMESPACE, else the kubeconfig context's, else `default`."""
    leader_election_name: str = "colocgrpo-operator"
    """Name of the Lease (one per operator installation)."""
    lease_duration: float = 15.0
    """Seconds of a holder's silence after which a standby takes the Lease."""
    renew_deadline: float = 10.0
    """Seconds a holder keeps failing to renew before it stops (below lease_duration)."""
    retry_period: float = 2.0
    """Seconds between renewals, and between a standby's looks at the Lease (below renew_deadline)."""

    def __post_init__(self) -> None:
        for namespace in self.namespaces:
            if not namespace.strip():
                raise ConfigError(FLAGS["namespaces"], "a namespace must not be empty")
        if self.trainer_image is not None and not self.trainer_image.strip():
            # An empty value (the chart's `--trainer-image=` with no image set) means the default.
            object.__setattr__(self, "trainer_image", None)
        if self.trainer_image is not None and not re.fullmatch(IMAGE_REFERENCE_PATTERN, self.trainer_image):
            # The same grammar spec.image is held to: a default the API would refuse in a job must not start.
            raise ConfigError(
                FLAGS["trainer_image"],
                f"must be an image reference such as registry.example.com/team/trainer:1.0; got {self.trainer_image!r}",
            )
        for name in ("metrics_port", "liveness_port"):
            port = getattr(self, name)
            if not _is_int(port) or not 0 <= port <= 65535:
                raise ConfigError(FLAGS[name], f"must be a port number from 1 to 65535, or 0 for off; got {port!r}")
        if self.metrics_port and self.metrics_port == self.liveness_port:
            raise ConfigError(FLAGS["metrics_port"], f"must differ from --liveness-port (both {self.metrics_port})")
        seconds = self.recheck_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ConfigError(FLAGS["recheck_seconds"], f"must be a number of seconds; got {seconds!r}")
        if seconds <= 0:
            raise ConfigError(FLAGS["recheck_seconds"], f"must be more than 0 seconds; got {seconds!r}")
        if not _is_int(self.api_threads) or self.api_threads < 1:
            raise ConfigError(FLAGS["api_threads"], f"must be at least 1; got {self.api_threads!r}")
        if not _is_int(self.kopf_connections) or self.kopf_connections < 0:
            raise ConfigError(
                FLAGS["kopf_connections"], f"must be 0 (unbounded) or more; got {self.kopf_connections!r}"
            )
        if self.kubeconfig is not None:
            if not os.path.isfile(self.kubeconfig):
                raise ConfigError(FLAGS["kubeconfig"], f"no such file: {self.kubeconfig}")
            # kopf and the operator's client read it later, maybe from another working directory.
            object.__setattr__(self, "kubeconfig", os.path.abspath(self.kubeconfig))
        for name in ("lease_duration", "renew_deadline", "retry_period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(FLAGS[name], f"must be a positive number of seconds; got {value!r}")
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ConfigError(
                FLAGS["renew_deadline"],
                "leader election needs --retry-period < --renew-deadline < --lease-duration; got "
                f"{self.retry_period:g} < {self.renew_deadline:g} < {self.lease_duration:g}",
            )
        if not self.leader_election_name.strip():
            raise ConfigError(FLAGS["leader_election_name"], "must not be empty")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(FLAGS["log_level"], f"must be one of {', '.join(LOG_LEVELS)}; got {self.log_level!r}")

    @property
    def clusterwide(self) -> bool:
        """True when every namespace is watched (no --namespace given)."""
        return not self.namespaces

    def kopf_connection_limit(self) -> int:
        """The connection bound of kopf's HTTP session; 0 means unbounded (kopf's default).

        kopf's session has no limit of its own: a burst of 500 jobs opened hundreds of TLS
        connections at once (one per concurrent annotation patch and Event), and their OpenSSL
        buffers left the allocator fragmented long after they closed (10-15 MiB of ~175 at 500
        jobs, docs/benchmarks/operator.md). The limit counts kopf's long-lived watch streams
        too, and a request waiting for a slot held by watches would wait forever, so the bound
        is the working pool plus room for every watch: `WATCH_CONNECTIONS_PER_NAMESPACE` per
        watched namespace (or once cluster-wide) and kopf's own CRD/namespace observers. A glob
        pattern can match any number of namespaces, so with one there is no bound.
        """
        if self.kopf_connections <= 0:
            return 0
        if any(char in namespace for namespace in self.namespaces for char in _GLOB_CHARACTERS):
            return 0
        watched = max(1, len(self.namespaces))
        return self.kopf_connections + OBSERVER_CONNECTIONS + WATCH_CONNECTIONS_PER_NAMESPACE * watched


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
