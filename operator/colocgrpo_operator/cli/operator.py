"""`colocgrpo operator`: run the kopf operator in this process."""

from __future__ import annotations

import argparse
import logging
import sys

from colocgrpo_operator.controller.config import LOG_LEVELS, ConfigError, OperatorConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `colocgrpo operator`: one flag per `OperatorConfig` field, defaults from the class."""
    defaults = OperatorConfig()
    parser = subparsers.add_parser(
        "operator",
        help="run the ColocGRPOJob operator (all namespaces unless --namespace is given)",
        description="Reconcile ColocGRPOJobs into gangs of pods and report their status. "
        "A bad value of any flag exits 2 before the operator starts, naming the flag.",
    )
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
        help="liveness probe port, path /healthz (0: off; default %(default)s)",
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
    parser.set_defaults(func=run)


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


# Installed for the CLI (watch, logs, demo), never used by the operator process.
UNUSED_CLIENT_PACKAGES = ("kubernetes", "kubernetes_asyncio")


def keep_out_unused_clients() -> None:
    """Mark the official Kubernetes clients as absent before kopf is imported.

    kopf imports `kubernetes` whenever it is installed, only to recognise its model classes and to
    offer it as a fallback login; the operator uses neither (controller/kube.py and the login
    handler in controller/startup.py speak HTTP themselves). The import alone is ~11 MiB of RSS.
    A None entry in sys.modules makes `import kubernetes` raise ImportError, which kopf handles;
    any other code in this process that tried to use the client would fail loudly in the
    operator tests instead of quietly costing memory. No-op for a package already imported.
    """
    for name in UNUSED_CLIENT_PACKAGES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None is the import system's "absent"


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # One Credentials object for the operator's client and kopf's session (an exec plugin runs
    # once per token, not once per client); a kubeconfig that cannot be used is one line here,
    # not a traceback from inside kopf.
    from colocgrpo_operator.controller.credentials import CredentialsError, load_credentials

    try:
        credentials = load_credentials(config.kubeconfig)
        credentials.bearer_token()
    except CredentialsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    limit_malloc_arenas()
    keep_out_unused_clients()
    configure_logging(config.log_level)

    import kopf

    from colocgrpo_operator.controller import handlers  # noqa: F401  (registers the handlers)

    liveness = f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None
    kopf.run(
        standalone=True,  # one replica (the chart's Deployment uses the Recreate strategy)
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        liveness_endpoint=liveness,
        # Read by the startup and login handlers (controller/startup.py).
        memo=kopf.Memo(config=config, credentials=credentials),
    )
    return 0


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
