"""`colocgrpo validate -f FILE`: check ColocGRPOJob manifests offline.

Exit 0 when every job is valid; exit 1 with one line per problem, each naming the
field path (e.g. `spec.vllm.tensorParallelSize: must divide ...`).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("validate", help="validate ColocGRPOJob manifests (exit 1 naming each bad field)")
    parser.add_argument("-f", "--filename", required=True, action="append", help="YAML file ('-' for stdin); repeatable")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.api.validation import JobSpecError, parse_job
    from colocgrpo_operator.manifest_files import ManifestError, load_documents

    failed = False
    for path in args.filename:
        try:
            documents = load_documents(path)
        except ManifestError as error:
            print(f"error: {error}", file=sys.stderr)
            failed = True
            continue
        for index, document in enumerate(documents):
            label = path if len(documents) == 1 else f"{path}[{index}]"
            try:
                job = parse_job(document)
            except JobSpecError as error:
                failed = True
                for line in error.lines():
                    print(f"{label}: {line}", file=sys.stderr)
                continue
            print(f"{label}: ColocGRPOJob {job.name} is valid")
    return 1 if failed else 0
