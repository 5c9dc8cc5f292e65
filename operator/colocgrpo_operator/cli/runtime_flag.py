"""`--runtime FILE`: the runtimes that offline verbs (`validate`, `render`, `plan`) merge a job with."""

from __future__ import annotations

import argparse
from typing import Any


def add_runtime_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML file of (Cluster)ColocGRPORuntimes that jobs name in spec.runtimeRef (repeatable; a runtime "
        "document in the job's own file counts too); the job is shown merged with its runtime",
    )


def load_runtimes(args: argparse.Namespace) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """The runtimes of every --runtime file, and one line per file that cannot be read."""
    from colocgrpo_operator.manifest_files import read_runtimes

    return read_runtimes(list(args.runtime))
