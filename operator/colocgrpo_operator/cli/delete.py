"""`colocgrpo delete NAME...`: delete ColocGRPOJobs, as `kubectl delete cgj` does. Their children (the
gang's batch Job and pods, ConfigMap, Service, trainer ServiceAccount and RBAC) go with them; the
checkpoints on a PersistentVolumeClaim stay.

--wait (the default, as in kubectl) returns once each job is gone from the API server; --wait=false
returns at once. --cascade=foreground deletes a job only after its children, orphan leaves them.

Exit status: 0; 1 a job that does not exist (unless --ignore-not-found), --timeout passed, or the
cluster unusable (as kubectl); 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors
from colocgrpo_operator.cli.suspend import RESOURCE

CASCADE = {"background": "Background", "foreground": "Foreground", "orphan": "Orphan"}


def _flag(value: str) -> bool:
    """kubectl's boolean flag values: --wait, --wait=true, --wait=false."""
    lowered = value.lower()
    if lowered in ("true", "t", "1", "yes"):
        return True
    if lowered in ("false", "f", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "delete",
        help="delete ColocGRPOJobs and, with them, their pods and other children",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="+", metavar="name", help="ColocGRPOJob metadata.name(s)")
    add_cluster_flags(parser)
    parser.add_argument(
        "--wait",
        type=_flag,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="wait until each job is gone (default true; --wait=false returns at once)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds (exit 1)")
    parser.add_argument(
        "--cascade",
        choices=sorted(CASCADE),
        default="background",
        help="background (default): the children go after the job; foreground: before it; orphan: they stay",
    )
    parser.add_argument("--ignore-not-found", action="store_true", help="a job that does not exist is not an error")
    parser.set_defaults(func=run)


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    import time

    from colocgrpo_operator.client import JobNotFound

    client = connect(args)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    status = 0
    try:
        for name in args.names:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                client.delete(name, wait=args.wait, timeout=timeout, propagation=CASCADE[args.cascade])
            except JobNotFound as missing:
                if not args.ignore_not_found:
                    print(f"error: {missing}", file=sys.stderr)
                    status = 1
                continue
            print(f'{RESOURCE} "{name}" deleted')
    finally:
        client.close()
    return status
