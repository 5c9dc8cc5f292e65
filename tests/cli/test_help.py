"""`colocgrpo --help` lists the user's commands only; every subcommand's --help explains itself, and those
with exit codes state them."""

from __future__ import annotations

import pytest

from colocgrpo_operator.cli import SUBCOMMAND_MODULES, build_parser
from support.cli_runner import USER_COMMANDS, listed_commands

# Subcommands whose exit status means more than ok/error, and the phrase of their help that says so.
EXIT_CODES_IN_HELP = {
    "validate": "exit 1 with one line per problem",
    "render": "Invalid jobs exit 1",
    "plan": "Exit 0 when the job fits, 1 when it cannot, 2 on bad input",
    "watch": "0 Succeeded, 1 Failed, deleted, not found or the cluster unusable (as kubectl), 2 a usage error",
    "logs": "1 no such job or no pod of that rank yet",
    "get": "also when no job matches",
    "describe": "1 no such job",
    "suspend": "1 no such job, a job that has ended",
    "resume": "1 no such job, a job that has ended",
    "delete": "1 a job that does not exist (unless --ignore-not-found), --timeout passed",
    "completion": "2 a usage error (an unknown shell)",
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


@pytest.mark.parametrize("name", ["watch", "logs", "describe", "suspend", "resume"])
def test_job_name_argument_is_explained(name):
    name_action = next(a for a in _subparsers()[name]._actions if a.dest == "name")
    assert name_action.help and "metadata.name" in name_action.help


def test_help_lists_the_users_commands_only():
    text = build_parser().format_help()
    listed = listed_commands(text)
    assert listed == USER_COMMANDS
    # The daemon and the pods' program are commands of their own; the developer tools are not the user's.
    assert "operator" not in listed and "train" not in listed
    assert " dev" not in text


def test_the_users_command_has_no_developer_tools(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["dev", "cluster", "status"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'dev'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["cluster", "status"], ["demo"]])
def test_developer_tools_are_colocgrpo_dev(argv):
    from colocgrpo_dev.cli import build_parser as dev_parser

    args = dev_parser().parse_args(argv)
    assert callable(args.func)


@pytest.mark.parametrize("removed", ["operator", "train", "demo"])
def test_moved_commands_are_not_user_subcommands(removed, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([removed])
    assert exited.value.code == 2
    assert f"invalid choice: '{removed}'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["get", "describe", "watch", "logs", "suspend", "resume", "delete"])
def test_cluster_commands_take_kubectls_flags(name):
    options = {o for a in _subparsers()[name]._actions for o in a.option_strings}
    assert {"--kubeconfig", "--context", "-n", "--namespace"} <= options


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("plan", ["-f", "j.yaml"]),
        ("render", ["-f", "j.yaml"]),
        ("validate", ["-f", "j.yaml"]),
        ("watch", ["job", "--once"]),
        ("get", []),
        ("from-recipe", ["r.yaml"]),
    ],
)
@pytest.mark.parametrize("output", ["json", "yaml"])
def test_commands_that_print_an_object_take_output_formats(name, argv, output):
    args = build_parser().parse_args([name, *argv, "-o", output])
    assert args.output == output
