"""`colocgrpo logs NAME [--rank N | --all] [-f]`: the trainer log of one rank of a job, or of every rank.

Rank N's pod is the pod of completion index N of the job's current batch Job (label
batch.kubernetes.io/job-completion-index), the newest one if a gang restart left several.

--all prints every rank's log with a `[rank N]` prefix: without -f merged in time order, with -f
as the lines arrive. -f follows the pods of a restarted gang too, and prints a `[rank N] ---` line
on stderr when a pod ends, goes away or is new; it ends once the job has ended (or is deleted).

Exit status: 0 the log was printed, 1 no such job or no pod of that rank yet, or the cluster
unusable (as kubectl), 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs",
        help="print (or follow) the trainer log of one rank of a job, or of every rank",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="the ColocGRPOJob's metadata.name")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, help="node rank = completion index (default 0)")
    which.add_argument("--all", action="store_true", help="every rank's log, each line prefixed by its rank")
    add_cluster_flags(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows")
    parser.add_argument("--tail", type=int, default=None, help="only the last N lines (of each pod's log)")
    parser.add_argument("--previous", action="store_true", help="the previous container instance (one rank)")
    parser.set_defaults(func=run)


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    if args.all and args.previous:
        print("error: --previous reads one rank's log: use --rank, not --all", file=sys.stderr)
        return 2
    client = connect(args)
    try:
        if args.all:
            nodes = ((client.get(args.name).object.get("spec") or {}).get("resources") or {}).get("nodes")
            width = len(str(max(int(nodes) - 1, 0))) if isinstance(nodes, int) else 1
            for line in client.all_logs(args.name, follow=args.follow, tail=args.tail):
                print(line.prefixed(width), file=sys.stderr if line.notice else sys.stdout, flush=True)
        else:
            for text in client.logs(
                args.name, rank=args.rank, follow=args.follow, tail=args.tail, previous=args.previous
            ):
                print(text, flush=True)
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()
    return 0
