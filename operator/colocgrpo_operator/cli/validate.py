"""`colocgrpo validate -f FILE`: check ColocGRPOJob manifests offline.

Exit 0 when every job is valid; exit 1 with one line per problem, each naming the
field path (e.g. `spec.vllm.tensorParallelSize: must divide ...`).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="validate ColocGRPOJob manifests (exit 1 naming each bad field)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f", "--filename", required=True, action="append", help="YAML file ('-' for stdin); repeatable"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.manifest_files import read_jobs

    failed = False
    for path in args.filename:
        jobs, problems = read_jobs(path)
        for line in problems:
            print(line, file=sys.stderr)
        failed = failed or bool(problems)
        for label, job in jobs:
            print(f"{label}: ColocGRPOJob {job.name} is valid")
    return 1 if failed else 0
