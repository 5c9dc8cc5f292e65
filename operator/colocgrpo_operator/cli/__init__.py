"""The `colocgrpo` command line.

Each subcommand lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`. Subcommand modules must import heavy dependencies
(kubernetes, kopf, torch) inside their handlers so `colocgrpo --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from colocgrpo_operator import __version__

# Order here is the order in `colocgrpo --help`.
SUBCOMMAND_MODULES: list[str] = [
    "crd",
    "validate",
    "render",
    "from_recipe",
    "train",
    "dev_cluster",
    "plan",
    "operator",
    "watch",
    "logs",
    "demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colocgrpo",
        description="Run GRPO with vLLM colocated in DeepSpeed ZeRO-3 training on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"colocgrpo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(f"colocgrpo_operator.cli.{module_name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
