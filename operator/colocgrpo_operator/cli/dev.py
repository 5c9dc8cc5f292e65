"""`colocgrpo dev`: the developer tools, kept out of the user's `--help`.

`colocgrpo dev cluster up|down|status`: the local control plane with fake GPU nodes.
`colocgrpo dev demo`: what `make demo` runs (cli/demo.py).
"""

from __future__ import annotations

import argparse
import json

from colocgrpo_operator.cli import demo


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # No help=: argparse then leaves `dev` out of the commands `colocgrpo --help` lists.
    dev = subparsers.add_parser(
        "dev",
        description="Developer tools: the local control plane with fake GPU nodes (`cluster`) and the demo that "
        "runs a job through it (`demo`, what `make demo` runs). They need this repository's checkout.",
    )
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="TOOL", required=True)
    cluster = dev_sub.add_parser(
        "cluster",
        help="local kube-apiserver/controller-manager/scheduler/etcd + KWOK fake GPU nodes on 127.0.0.1",
    )
    actions = cluster.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    for action, text in (
        (
            "up",
            "build missing binaries, start the cluster (idempotent), install the ColocGRPOJob CRD and "
            "the trainer status policy; last line: kubeconfig path",
        ),
        ("down", "stop every process `up` started and remove the cluster's state"),
        ("status", "print the cluster's state as JSON"),
    ):
        parser = actions.add_parser(action, help=text, description=text)
        parser.add_argument("--name", default=None, help="cluster name (default: colocgrpo)")
        parser.set_defaults(func=_run)
    demo.register(dev_sub)


def _run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.devcluster.cluster import DEFAULT_NAME, DevCluster

    cluster = DevCluster(name=args.name or DEFAULT_NAME)
    if args.cluster_action == "up":
        print(cluster.up().resolve(), flush=True)
    elif args.cluster_action == "down":
        cluster.down()
    else:
        status = cluster.status()
        print(json.dumps(status, indent=2))
        return 0 if status["ready"] else 1
    return 0
