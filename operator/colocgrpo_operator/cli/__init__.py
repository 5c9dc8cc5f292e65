"""The user's command line: `colocgrpo`, and the same program as the kubectl plugin `kubectl colocgrpo`.

Each subcommand lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`. Subcommand modules must import heavy dependencies
(kubernetes, kopf, torch) inside their handlers so `colocgrpo --help` stays fast.

`colocgrpo __complete WORDS` (hidden) answers the shell completion scripts of `colocgrpo completion`.

The operator daemon (`colocgrpo-operator`, `colocgrpo_operator.daemon`) and the trainer pods'
program (`colocgrpo-train`, `colocgrpo_training.entrypoint`) are commands of their own. The
developer tools (the local cluster, the demo) are `colocgrpo-dev`, from the checkout's dev/ folder.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from colocgrpo_operator import __version__

# Order here is the order in `colocgrpo --help`.
SUBCOMMAND_MODULES: list[str] = [
    "validate",
    "plan",
    "render",
    "from_recipe",
    "get",
    "describe",
    "watch",
    "logs",
    "suspend",  # suspend and resume
    "delete",
    "crd",
    "completion",
]
# The hidden subcommand the completion scripts call (cli/completion.py), as cobra's programs name it.
COMPLETE_COMMAND = "__complete"

PROG = "colocgrpo"
KUBECTL_PLUGIN_PROG = "kubectl colocgrpo"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of every user subcommand, named `prog` in usage lines and help."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run GRPO with vLLM colocated in DeepSpeed ZeRO-3 training on Kubernetes: check, plan and "
        "render ColocGRPOJobs offline, follow them on a cluster.",
    )
    parser.add_argument("--version", action="version", version=f"colocgrpo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(f"colocgrpo_operator.cli.{module_name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run one subcommand; returns its exit status (2 for a usage error)."""
    parser = build_parser(prog)
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == [COMPLETE_COMMAND]:
        from colocgrpo_operator.cli.completion import answer

        sys.stdout.write(answer(parser, words[1:]))
        return 0
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def kubectl_main(argv: list[str] | None = None) -> int:
    """The `kubectl-colocgrpo` console script: kubectl runs it for `kubectl colocgrpo ...`."""
    return main(argv, prog=KUBECTL_PLUGIN_PROG)


def kubectl_complete_main(argv: list[str] | None = None) -> int:
    """The `kubectl_complete-colocgrpo` console script: kubectl's own shell completion runs it with the words
    after `kubectl colocgrpo` to complete `kubectl colocgrpo ...` (kubectl 1.26 and later)."""
    words = sys.argv[1:] if argv is None else argv
    return main([COMPLETE_COMMAND, *words], prog=KUBECTL_PLUGIN_PROG)


if __name__ == "__main__":
    sys.exit(main())
