"""`colocgrpo logs NAME [--rank N] [-f]`: the trainer log of one rank of a job.

Rank N's pod is the pod of completion index N of the job's current batch Job (label
batch.kubernetes.io/job-completion-index), the newest one if a gang restart left several.

Exit status: 0 the log was printed, 1 no such job or no pod of that rank yet, or the cluster
unusable (as kubectl), 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from colocgrpo_operator.cli.cluster_errors import EXIT_NOT_FOUND, add_cluster_flags, connect, reports_cluster_errors


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs",
        help="print (or follow) the trainer log of one rank of a job",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="the ColocGRPOJob's metadata.name")
    parser.add_argument("--rank", type=int, default=0, help="node rank = completion index (default 0)")
    add_cluster_flags(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing as the log grows")
    parser.add_argument("--tail", type=int, default=None, help="only the last N lines")
    parser.add_argument("--previous", action="store_true", help="the previous container instance")
    parser.set_defaults(func=run)


def pick_pod(pods: list[dict[str, Any]], rank: int) -> dict[str, Any] | None:
    """The newest live pod of that completion index (pure; tested without a cluster)."""
    from colocgrpo_operator.api import COMPLETION_INDEX_KEY

    candidates = [p for p in pods if (p.get("metadata") or {}).get("labels", {}).get(COMPLETION_INDEX_KEY) == str(rank)]
    candidates.sort(
        key=lambda p: (
            not (p.get("metadata") or {}).get("deletionTimestamp"),
            (p.get("metadata") or {}).get("creationTimestamp") or "",
        )
    )
    return candidates[-1] if candidates else None


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.api import COMPLETION_INDEX_KEY, JOB_NAME_LABEL
    from colocgrpo_operator.kube.client import KubeApiError

    api, namespace = connect(args)
    listing = api.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"{JOB_NAME_LABEL}={args.name}"}
    )
    pods: list[dict[str, Any]] = (listing or {}).get("items") or []
    pod = pick_pod(pods, args.rank)
    if pod is None:
        ranks = sorted({(p.get("metadata") or {}).get("labels", {}).get(COMPLETION_INDEX_KEY) for p in pods} - {None})
        if not pods and not _job_exists(api, namespace, args.name):
            print(f"error: ColocGRPOJob {namespace}/{args.name} not found", file=sys.stderr)
            return EXIT_NOT_FOUND
        hint = f" (ranks with pods: {', '.join(ranks)})" if ranks else " (the job has no pods yet)"
        print(f"error: no pod of rank {args.rank} for job {namespace}/{args.name}{hint}", file=sys.stderr)
        return EXIT_NOT_FOUND
    name = pod["metadata"]["name"]
    query = {"container": "trainer", "follow": str(args.follow).lower(), "previous": str(args.previous).lower()}
    if args.tail is not None:
        query["tailLines"] = str(args.tail)
    try:
        response = api.stream(f"/api/v1/namespaces/{namespace}/pods/{name}/log", query=query)
        try:
            for chunk in response.stream(4096):
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
        finally:
            response.release_conn()
    except KubeApiError as error:
        print(f"error: logs of pod {namespace}/{name}: {error.reason}: {error.message}".strip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        api.close()
    return 0


def _job_exists(api: Any, namespace: str, name: str) -> bool:
    from colocgrpo_operator.kube.client import KIND, KubeApiError, object_path

    try:
        api.request("GET", object_path(KIND, namespace, name))
    except KubeApiError as error:
        if error.status == 404:
            return False
        raise
    return True
