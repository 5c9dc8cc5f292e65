"""`colocgrpo operator`: run the kopf operator in this process."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the ColocGRPOJob operator (all namespaces unless --namespace is given)",
        description="Reconcile ColocGRPOJobs into gangs of pods and report their status.",
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
    parser.add_argument("--trainer-image", default=None, help="trainer image for jobs without spec.image")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--liveness-port", type=int, default=8080, help="liveness probe port, path /healthz (0: off)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or $KUBECONFIG)")
    parser.add_argument(
        "--recheck-seconds",
        type=float,
        default=None,
        help="how often active jobs are re-checked (stall detection granularity; default 10)",
    )
    parser.set_defaults(func=run)


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
    handler in controller/settings.py speak HTTP themselves). The import alone is ~11 MiB of RSS.
    A None entry in sys.modules makes `import kubernetes` raise ImportError, which kopf handles;
    any other code in this process that tried to use the client would fail loudly in the
    operator tests instead of quietly costing memory. No-op for a package already imported.
    """
    for name in UNUSED_CLIENT_PACKAGES:
        sys.modules.setdefault(name, None)


def run(args: argparse.Namespace) -> int:
    limit_malloc_arenas()
    keep_out_unused_clients()
    from colocgrpo_operator.controller import settings as operator_settings

    if args.all_namespaces and args.namespace:
        print("error: --all-namespaces and --namespace exclude each other", file=sys.stderr)
        return 2

    # The startup handler reads its configuration from the environment, so the same handlers
    # serve `colocgrpo operator`, `kopf run -m colocgrpo_operator.controller.handlers` and tests.
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)
    if args.trainer_image:
        os.environ[operator_settings.ENV_TRAINER_IMAGE] = args.trainer_image
    os.environ[operator_settings.ENV_METRICS_PORT] = str(args.metrics_port)
    os.environ[operator_settings.ENV_WATCHED_NAMESPACES] = ",".join(args.namespace)
    if args.recheck_seconds:
        os.environ[operator_settings.ENV_ACTIVE_INTERVAL] = str(args.recheck_seconds)

    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    # aiohttp and urllib3 log every request at DEBUG; keep ours readable.
    for noisy in ("aiohttp", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, getattr(logging, args.log_level)))
    # kopf logs every handler and timer success at INFO ("Handler ... succeeded"): with child
    # events and re-checks that is several lines per job per second. Our own reconciler logs
    # each phase transition (logger colocgrpo.operator); kopf's per-object chatter only at DEBUG.
    if args.log_level != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    import kopf

    from colocgrpo_operator.controller import handlers  # noqa: F401  (registers the handlers)

    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    kopf.run(
        standalone=True,  # one replica (the chart's Deployment uses the Recreate strategy)
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
    )
    return 0
