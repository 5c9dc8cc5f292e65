"""Runs the `colocgrpo` command (or the `colocgrpo-operator` daemon) as a user runs it: a fresh
interpreter, this checkout's packages.

Importable from every test folder: pytest puts tests/ on sys.path for tests/conftest.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What `colocgrpo --help` lists, in its order: the user's commands only.
USER_COMMANDS = [
    "validate",
    "plan",
    "render",
    "from-recipe",
    "get",
    "describe",
    "watch",
    "logs",
    "suspend",
    "resume",
    "delete",
    "crd",
    "completion",
]

# The module behind each console script, run with this interpreter so this checkout's code is what runs.
PROGRAMS = {"colocgrpo": "colocgrpo_operator.cli", "colocgrpo-operator": "colocgrpo_operator"}


def run_colocgrpo(*args: str, stdin: str | None = None, program: str = "colocgrpo") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    return subprocess.run(
        [sys.executable, "-m", PROGRAMS[program], *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def listed_commands(help_text: str) -> list[str]:
    """The subcommands a top-level --help lists (argparse indents each name by four spaces)."""
    return re.findall(r"^ {4}(\S+)", help_text, flags=re.M)
