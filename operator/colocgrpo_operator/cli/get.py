"""`colocgrpo get [NAME...]`: ColocGRPOJobs as a table, the columns of `kubectl get cgj` with training
progress: NAME, PHASE, NODES, GPUS, TP, STEP (step/maxSteps), REWARD, RESTARTS, AGE (`-o wide` adds
REASON, why the job is in its phase). Without a name, every job of the namespace; -A, of every
namespace (a NAMESPACE column first); -l, those whose labels match.

`-o json|yaml` prints the objects instead: one job as itself, several as a `v1 List`, as kubectl does.

Exit status: 0, also when no job matches ("No resources found" on stderr); 1 a named job that does not
exist, or the cluster unusable (as kubectl); 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors
from colocgrpo_operator.cli.output import OUTPUT_FORMATS, as_list, format_object, table

if TYPE_CHECKING:
    from colocgrpo_operator.client import JobState

COLUMNS = ("NAME", "PHASE", "NODES", "GPUS", "TP", "STEP", "REWARD", "RESTARTS", "AGE")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "get",
        help="list ColocGRPOJobs with their phase, step and reward",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", metavar="name", help="ColocGRPOJob metadata.name(s); none: every job")
    add_cluster_flags(parser)
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the jobs of every namespace (a NAMESPACE column first)"
    )
    parser.add_argument("-l", "--selector", default=None, help="only jobs whose labels match (e.g. team=a)")
    parser.add_argument(
        "-o",
        "--output",
        choices=(*OUTPUT_FORMATS, "wide"),
        default=None,
        help="json or yaml: print the objects instead; wide: add the REASON column",
    )
    parser.set_defaults(func=run)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _reward(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def row(state: JobState, *, now: datetime, namespace: bool = False, wide: bool = False) -> list[str]:
    """One job's cells, in COLUMNS' order (NAMESPACE first, REASON last when asked). Pure."""
    from colocgrpo_operator.client.views import age

    spec = state.object.get("spec") or {}
    resources, vllm = spec.get("resources") or {}, spec.get("vllm") or {}
    workers = state.status.get("workers") or {}
    step = "" if state.step is None else f"{state.step}/{_cell(state.max_steps) or '-'}"
    cells = [
        state.name,
        _cell(state.phase),
        _cell(resources.get("nodes")),
        _cell(workers.get("gpus")),
        _cell(vllm.get("tensorParallelSize")),
        step,
        _reward(state.reward),
        str(state.restarts),
        age((state.object.get("metadata") or {}).get("creationTimestamp"), now),
    ]
    if namespace:
        cells.insert(0, state.namespace)
    if wide:
        cells.append(_cell((state.condition("Running") or {}).get("reason")))
    return cells


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        if args.names:
            if args.all_namespaces:
                print("error: a job's name is looked up in one namespace: use -n, not -A", file=sys.stderr)
                return 2
            states = [client.get(name) for name in args.names]
        else:
            states = client.list(all_namespaces=args.all_namespaces, selector=args.selector)
    finally:
        client.close()
    if args.output in OUTPUT_FORMATS:
        objects = [dict(state.object) for state in states]
        single = len(args.names) == 1
        sys.stdout.write(format_object(objects[0] if single else as_list(objects), args.output))
        return 0
    if not states:
        where = "any namespace" if args.all_namespaces else f"{client.namespace} namespace"
        print(f"No resources found in {where}.", file=sys.stderr)
        return 0
    wide = args.output == "wide"
    header = [*(["NAMESPACE"] if args.all_namespaces else []), *COLUMNS, *(["REASON"] if wide else [])]
    now = datetime.now(UTC)
    rows = [row(state, now=now, namespace=args.all_namespaces, wide=wide) for state in states]
    sys.stdout.write(table(rows, header))
    return 0
