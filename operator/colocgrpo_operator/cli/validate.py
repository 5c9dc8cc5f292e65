"""`colocgrpo validate -f FILE`: check ColocGRPOJob manifests offline.

Exit 0 when every job is valid; exit 1 with one line per problem, each naming the
field path (e.g. `spec.vllm.tensorParallelSize: must divide ...`). A valid job that uses a
deprecated field gets a `warning:` line on stderr naming it, and still exits 0. `-o json|yaml` prints the
valid jobs as the API model reads them, every default filled in (one job as itself, several
as one `v1 List`) instead of a line per job.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from colocgrpo_operator.cli.output import add_output_flag, as_list, format_object
from colocgrpo_operator.cli.runtime_flag import add_runtime_flag, load_runtimes


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
    add_output_flag(parser, "the valid jobs, defaults filled in,")
    add_runtime_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.api.queueing import job_warnings
    from colocgrpo_operator.manifest_files import read_jobs

    runtimes, unreadable = load_runtimes(args)
    for line in unreadable:
        print(line, file=sys.stderr)
    failed = bool(unreadable)
    valid: list[dict[str, Any]] = []
    for path in args.filename:
        jobs, problems = read_jobs(path, runtimes=runtimes)
        for line in problems:
            print(line, file=sys.stderr)
        failed = failed or bool(problems)
        for label, job in jobs:
            for path, message in job_warnings(job):
                print(f"{label}: warning: {path}: {message}", file=sys.stderr)
            if args.output:
                valid.append(job.to_dict())
            else:
                print(f"{label}: ColocGRPOJob {job.name} is valid")
    if args.output and valid:
        sys.stdout.write(format_object(valid[0] if len(valid) == 1 else as_list(valid), args.output))
    return 1 if failed else 0
