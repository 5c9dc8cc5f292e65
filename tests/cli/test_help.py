"""Every `colocgrpo` subcommand's --help explains itself; those with exit codes state them."""

from __future__ import annotations

import pytest

from colocgrpo_operator.cli import SUBCOMMAND_MODULES, build_parser

# Subcommands whose exit status means more than ok/error, and the phrase of their help that says so.
EXIT_CODES_IN_HELP = {
    "validate": "exit 1 with one line per problem",
    "render": "Invalid jobs exit 1",
    "plan": "Exit 0 when the job fits, 1 when it cannot, 2 on bad input",
    "watch": "0 Succeeded, 1 Failed, 2 job not found",
    "from-recipe": "exit 1 when something\ncould not be translated",
}


def _subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)


def test_every_subcommand_has_a_description():
    subparsers = _subparsers()
    assert len(subparsers) >= len(SUBCOMMAND_MODULES)
    missing = sorted(name for name, sub in subparsers.items() if not (sub.description or "").strip())
    assert not missing, f"subcommands whose --help has no description: {missing}"


@pytest.mark.parametrize("name", sorted(EXIT_CODES_IN_HELP))
def test_exit_codes_are_in_the_help(name):
    # argparse re-wraps some descriptions; compare with whitespace collapsed.
    help_text = " ".join(_subparsers()[name].format_help().split())
    assert " ".join(EXIT_CODES_IN_HELP[name].split()) in help_text


@pytest.mark.parametrize("name", ["watch", "logs"])
def test_job_name_argument_is_explained(name):
    name_action = next(a for a in _subparsers()[name]._actions if a.dest == "name")
    assert name_action.help and "metadata.name" in name_action.help
