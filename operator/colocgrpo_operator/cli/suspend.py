"""`colocgrpo suspend NAME` and `colocgrpo resume NAME`: pause a job and continue it, through
spec.runPolicy.suspend (a merge patch, the one spec field that may change once a job has started).

Suspending deletes the gang's pods (a Kueue-managed job also gives back its quota); resuming starts a
new gang, which continues from the last checkpoint (checkpoint.resume auto). A job that has already
Succeeded or Failed is neither suspended nor resumed: it never runs again.

Exit status: 0 done, or nothing to do (already suspended, or not suspended); 1 no such job, a job that
has ended, or the cluster unusable (as kubectl); 2 a usage error.
"""

from __future__ import annotations

import argparse

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors

RESOURCE = "colocgrpojob.colocgrpo.io"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb, text in (
        ("suspend", "suspend a ColocGRPOJob: its pods are deleted, resume continues from the last checkpoint"),
        ("resume", "resume a suspended ColocGRPOJob: a new gang continues from the last checkpoint"),
    ):
        parser = subparsers.add_parser(
            verb, help=text, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.add_argument("name", help="the ColocGRPOJob's metadata.name")
        add_cluster_flags(parser)
        parser.set_defaults(func=run, verb=verb)


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        suspend = args.verb == "suspend"
        changed = client.suspend(args.name) if suspend else client.resume(args.name)
    finally:
        client.close()
    if changed:
        print(f"{RESOURCE}/{args.name} {'suspended' if suspend else 'resumed'}")
    else:
        print(f"{RESOURCE}/{args.name} {'already suspended' if suspend else 'is not suspended'}: nothing to do")
    return 0
