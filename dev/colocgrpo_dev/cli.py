"""`colocgrpo-dev`: the developer tools' command line (this checkout's, never the user's `colocgrpo`).

`colocgrpo-dev cluster up|down|status`: the local control plane with fake GPU nodes.
`colocgrpo-dev demo`: what `make demo` runs (demo.py).
"""

from __future__ import annotations

import argparse
import json

from colocgrpo_dev import demo

PROG = "colocgrpo-dev"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every developer tool."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Developer tools of a colocgrpo checkout: the local control plane with fake GPU nodes "
        "(`cluster`) and the demo that runs a job through it (`demo`, what `make demo` runs).",
    )
    tools = parser.add_subparsers(dest="tool", metavar="TOOL", required=True)
    cluster = tools.add_parser(
        "cluster",
        help="local kube-apiserver/controller-manager/scheduler/etcd + KWOK fake GPU nodes on 127.0.0.1, "
        "and a real node that runs containers",
    )
    actions = cluster.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    for action, text in (
        (
            "up",
            "build missing binaries, start the cluster (idempotent) with the real node where this machine can "
            "run containers, install the ColocGRPOJob CRD and the trainer status policy; last line: kubeconfig path",
        ),
        ("down", "stop every process `up` started and remove the cluster's state"),
        ("status", "print the cluster's state as JSON"),
    ):
        action_parser = actions.add_parser(action, help=text, description=text)
        action_parser.add_argument("--name", default=None, help="cluster name (default: colocgrpo)")
        if action == "up":
            action_parser.add_argument(
                "--no-node",
                action="store_true",
                help="fake GPU nodes only: no real node (kubelet, containerd, CoreDNS) that runs containers",
            )
        action_parser.set_defaults(func=_cluster)
    demo.register(tools)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one tool; returns its exit status (2 for a usage error)."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def _cluster(args: argparse.Namespace) -> int:
    from colocgrpo_dev.cluster.cluster import DEFAULT_NAME, DevCluster

    cluster = DevCluster(name=args.name or DEFAULT_NAME, real_node=not getattr(args, "no_node", False))
    if args.cluster_action == "up":
        print(cluster.up().resolve(), flush=True)
    elif args.cluster_action == "down":
        cluster.down()
    else:
        status = cluster.status()
        print(json.dumps(status, indent=2))
        return 0 if status["ready"] else 1
    return 0
