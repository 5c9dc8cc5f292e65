"""The `colocgrpo` commands README.md and the docs' shell blocks show are accepted by the CLI as written.

Runs each command line through the real argument parser (placeholders such as <name> filled in),
so a renamed flag or subcommand breaks this test instead of a reader's first try.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from colocgrpo_operator.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOC_PAGES = sorted((REPO / "docs").rglob("*.md"))
DEMO_NAMESPACE = "colocgrpo-demo"


def readme_commands() -> list[str]:
    text = README.read_text()
    inline = re.findall(r"`(?:kubectl )?(colocgrpo [^`]*)`", text)
    return inline + block_commands(text)


def block_commands(text: str) -> list[str]:
    """The `colocgrpo ...` commands of a page's ```bash blocks (inline mentions in docs are often synopses)."""
    in_blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0]
            for part in re.split(r"&&|;|\|", line):
                part = part.split(">", 1)[0].strip()
                part = part.removeprefix("kubectl ")  # the plugin: the same program
                if part.startswith("colocgrpo "):
                    in_blocks.append(part)
    return in_blocks


def runnable(command: str) -> list[str] | None:
    """argv after `colocgrpo`, or None where prose only names a command (`colocgrpo plan`, `... up/down`)."""
    argv = shlex.split(re.sub(r"<[^>]+>", "some-job", command))[1:]
    if len(argv) == 1 or ("/" in argv[-1] and not argv[-1].endswith(".yaml")):
        return None
    if argv[-1] in ("-f", "--filename"):  # `colocgrpo render -f` named in prose
        argv.append("job.yaml")
    return argv


def subcommands() -> set[str]:
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return set(action.choices)


COMMANDS = readme_commands()
DOC_COMMANDS = [(page, command) for page in DOC_PAGES for command in block_commands(page.read_text())]


def test_readme_shows_commands():
    assert len(COMMANDS) >= 6, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command):
    assert_parses(command)


def assert_parses(command: str) -> None:
    assert command.split()[1] in subcommands(), f"the docs name `{command}`, which is not a subcommand"
    argv = runnable(command)
    if argv is None:
        return
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"the documented command `{command}` is rejected by the CLI (exit {exit_.code})")
    assert callable(getattr(args, "func", None)), command


def test_docs_show_commands():
    assert len(DOC_COMMANDS) >= 5, DOC_COMMANDS


@pytest.mark.parametrize(("page", "command"), DOC_COMMANDS, ids=[f"{p.name}:{c}" for p, c in DOC_COMMANDS])
def test_docs_command_parses(page, command):
    assert_parses(command)


@pytest.mark.parametrize("command", [c for c in COMMANDS if "tiny-cpu" in c and c.split()[1] in ("watch", "logs")])
def test_demo_job_commands_name_the_demo_namespace(command):
    # The demo's job lives in colocgrpo-demo; without -n the command looks in the context's namespace and fails.
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert args.namespace == DEMO_NAMESPACE, command
