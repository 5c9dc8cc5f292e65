"""Runs the `colocgrpo` command as a user runs it: a fresh interpreter, this checkout's packages.

Importable from every test folder: pytest puts tests/ on sys.path for tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_colocgrpo(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    return subprocess.run(
        [sys.executable, "-m", "colocgrpo_operator.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
