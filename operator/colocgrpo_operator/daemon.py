"""`colocgrpo-operator` (also `python -m colocgrpo_operator`): the operator daemon, run in this process.

What the chart's Deployment and the operator image run; not a command of the user's `colocgrpo`.
Exit status: 0 stopped cleanly, 2 a bad flag or an unusable kubeconfig (named, before anything
starts), 3 leadership lost (another replica takes over).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING

from colocgrpo_operator.kopf_glue.config import LOG_LEVELS, ConfigError, OperatorConfig

if TYPE_CHECKING:
    from colocgrpo_operator.kube.credentials import Credentials
    from colocgrpo_operator.kube.leadership import LeaderElector


def build_parser() -> argparse.ArgumentParser:
    """The `colocgrpo-operator` parser: one flag per `OperatorConfig` field, defaults from the class."""
    from colocgrpo_operator import __version__

    defaults = OperatorConfig()
    parser = argparse.ArgumentParser(
        prog="colocgrpo-operator",
        description="Run the ColocGRPOJob operator: reconcile ColocGRPOJobs into gangs of pods and report their "
        "status (all namespaces unless --namespace is given). A bad value of any flag exits 2 before the operator "
        "starts, naming the flag.",
    )
    parser.add_argument("--version", action="version", version=f"colocgrpo-operator {__version__}")
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable; glob patterns allowed); default: all",
    )
    parser.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="watch every namespace (the default without --namespace; explicit for charts)",
    )
    parser.add_argument(
        "--trainer-image",
        default=defaults.trainer_image,
        metavar="IMAGE",
        help="trainer image for jobs without spec.image (empty or unset: colocgrpo/trainer:<version>)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=defaults.metrics_port,
        metavar="PORT",
        help="Prometheus /metrics port (0: off; default %(default)s)",
    )
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=defaults.liveness_port,
        metavar="PORT",
        help="probe port: liveness /healthz, readiness /readyz (0: off; default %(default)s)",
    )
    parser.add_argument("--log-level", default=defaults.log_level, choices=LOG_LEVELS, help="default %(default)s")
    parser.add_argument(
        "--kubeconfig",
        default=defaults.kubeconfig,
        metavar="FILE",
        help="kubeconfig file (default: in-cluster or $KUBECONFIG)",
    )
    parser.add_argument(
        "--recheck-seconds",
        type=float,
        default=defaults.recheck_seconds,
        metavar="SECONDS",
        help="how often every active job is re-checked, in seconds (stall detection granularity; default %(default)s)",
    )
    parser.add_argument(
        "--api-threads",
        type=int,
        default=defaults.api_threads,
        metavar="N",
        help="threads (and connections) for the operator's own API calls (default %(default)s)",
    )
    parser.add_argument(
        "--kopf-connections",
        type=int,
        default=defaults.kopf_connections,
        metavar="N",
        help="kopf's HTTP connections besides its watch streams (0: unbounded; default %(default)s)",
    )
    election = parser.add_argument_group("leader election (several replicas, one reconciling)")
    election.add_argument(
        "--leader-election",
        action="store_true",
        help="reconcile only while holding a coordination.k8s.io Lease; otherwise stand by to take over",
    )
    election.add_argument(
        "--leader-election-namespace",
        default=defaults.leader_election_namespace,
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the kubeconfig's namespace, else default)",
    )
    election.add_argument(
        "--leader-election-name",
        default=defaults.leader_election_name,
        metavar="NAME",
        help="name of the Lease (default %(default)s)",
    )
    election.add_argument(
        "--lease-duration",
        type=float,
        default=defaults.lease_duration,
        metavar="SECONDS",
        help="a standby takes over after this long without a renewal (default %(default)s)",
    )
    election.add_argument(
        "--renew-deadline",
        type=float,
        default=defaults.renew_deadline,
        metavar="SECONDS",
        help="the holder stops when it could not renew for this long (default %(default)s)",
    )
    election.add_argument(
        "--retry-period",
        type=float,
        default=defaults.retry_period,
        metavar="SECONDS",
        help="how often the holder renews and a standby looks (default %(default)s)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """The `OperatorConfig` the parsed flags describe; raises ConfigError naming a bad flag."""
    if args.all_namespaces and args.namespace:
        raise ConfigError("--all-namespaces", "cannot be combined with --namespace")
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        trainer_image=args.trainer_image,
        metrics_port=args.metrics_port,
        liveness_port=args.liveness_port,
        recheck_seconds=args.recheck_seconds,
        api_threads=args.api_threads,
        kopf_connections=args.kopf_connections,
        kubeconfig=args.kubeconfig,
        log_level=args.log_level,
        leader_election=args.leader_election,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_name=args.leader_election_name,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas before any thread starts.

    glibc gives each new thread its own arena (up to 8 per core); with kopf's handler threads
    the operator's RSS grows with the thread count, not with the work. Two arenas keep it
    proportional to the number of jobs. No-op outside glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # -8 is M_ARENA_MAX
    except (OSError, AttributeError):
        pass


# Installed with the developer tools (the local cluster, the demo), never used by the operator process.
UNUSED_CLIENT_PACKAGES = ("kubernetes", "kubernetes_asyncio")


def keep_out_unused_clients() -> None:
    """Mark the official Kubernetes clients as absent before kopf is imported.

    kopf imports `kubernetes` whenever it is installed, only to recognise its model classes and to
    offer it as a fallback login; the operator uses neither (kube/client.py and the login
    handler in kopf_glue/startup.py speak HTTP themselves). The import alone is ~11 MiB of RSS.
    A None entry in sys.modules makes `import kubernetes` raise ImportError, which kopf handles;
    any other code in this process that tried to use the client would fail loudly in the
    operator tests instead of quietly costing memory. No-op for a package already imported.
    """
    for name in UNUSED_CLIENT_PACKAGES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None is the import system's "absent"


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments) and run the operator until it is stopped."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the operator the parsed flags describe; returns the exit status."""
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # One Credentials object for the operator's client and kopf's session (an exec plugin runs
    # once per token, not once per client); a kubeconfig that cannot be used is one line here,
    # not a traceback from inside kopf.
    from colocgrpo_operator.kube.credentials import CredentialsError, load_credentials

    try:
        credentials = load_credentials(config.kubeconfig)
        credentials.bearer_token()
    except CredentialsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    limit_malloc_arenas()
    keep_out_unused_clients()
    configure_logging(config.log_level)

    from colocgrpo_operator.kopf_glue.health import Probes, serve_probes
    from colocgrpo_operator.kopf_glue.run import run_kopf  # imports kopf, registers the handlers
    from colocgrpo_operator.metrics import start_metrics_server

    elector = _elector(config, credentials) if config.leader_election else None
    if config.metrics_port > 0:
        start_metrics_server(config.metrics_port)  # before standing by: a standby has metrics too
    probes = Probes(elector)
    probe_server = serve_probes(probes, config.liveness_port) if config.liveness_port else None
    if elector is not None:
        elector.start()
        elector.wait_until_leading()  # standing by: no watches, no writes, only reading the Lease
    loop = asyncio.new_event_loop()
    probes.loop = loop
    try:
        run_kopf(config, credentials, loop, ready_flag=probes.started)
    finally:
        _close_loop(loop)
        if elector is not None:
            elector.stop(release=True)  # a standby takes over at once, not after the lease duration
        if probe_server is not None:
            probe_server.shutdown()
    return 0


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What `asyncio.run` does once its coroutine is done, for the loop kopf ran on (kopf runs a
    loop it is given and leaves it as it is): cancel the tasks left, let async generators run
    their cleanup, close. Left to the garbage collector at exit, an unfinished watch stream's
    generator was an asyncio ERROR ("Task was destroyed but it is pending")."""
    try:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _elector(config: OperatorConfig, credentials: Credentials) -> LeaderElector:
    """The Lease candidate of this replica, with a client of its own."""
    from colocgrpo_operator.api.naming import OPERATOR_NAME
    from colocgrpo_operator.kube.client import KubeApi
    from colocgrpo_operator.kube.leadership import LeaderElector, Timing, default_identity

    def lost(why: str) -> None:
        # Another replica may take over from now on: stop reconciling at once, mid-whatever.
        logging.getLogger("colocgrpo.operator").critical("leadership lost (%s): exiting", why)
        logging.shutdown()
        os._exit(3)

    namespace = config.leader_election_namespace or os.environ.get("POD_NAMESPACE") or credentials.namespace
    return LeaderElector(
        KubeApi(credentials, field_manager=OPERATOR_NAME, pool_size=1, timeout=config.retry_period * 2),
        namespace=namespace or "default",
        name=config.leader_election_name,
        identity=default_identity(),
        timing=Timing(config.lease_duration, config.renew_deadline, config.retry_period),
        on_lost=lost,
    )


def configure_logging(level: str) -> None:
    """Our log format at `level`; HTTP libraries and kopf's per-object lines kept quieter."""
    logging.basicConfig(level=getattr(logging, level), format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    # aiohttp and urllib3 log every request at DEBUG; keep ours readable.
    for noisy in ("aiohttp", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, getattr(logging, level)))
    # kopf logs every handler and timer success at INFO ("Handler ... succeeded"): with child
    # events and re-checks that is several lines per job per second. Our own reconciler logs
    # each phase transition (logger colocgrpo.operator); kopf's per-object chatter only at DEBUG.
    if level != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
