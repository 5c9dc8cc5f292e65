"""Shell completion: the answer `colocgrpo __complete` gives (cobra's format, which kubectl's plugin completion
reads), and the bash and zsh scripts of `colocgrpo completion` run by the real shells. Completing job names
from a cluster, and through kubectl, is tested against the dev cluster in tests/operator/test_kubectl_verbs.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.cli import build_parser
from colocgrpo_operator.cli.completion import DIRECTIVE_DEFAULT, DIRECTIVE_NO_FILES, complete
from support.cli_runner import USER_COMMANDS, run_colocgrpo

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NO_CLUSTER = {"KUBECONFIG": "/nonexistent/kubeconfig", "HOME": "/nonexistent"}


def values(*words: str, environ=NO_CLUSTER) -> tuple[list[str], int]:
    found, directive = complete(build_parser(), list(words), environ)
    return [value for value, _ in found], directive


def test_subcommands_and_top_level_flags():
    assert values("") == (USER_COMMANDS, DIRECTIVE_NO_FILES)
    assert values("de") == (["describe", "delete"], DIRECTIVE_NO_FILES)
    assert values("--v") == (["--version"], DIRECTIVE_NO_FILES)
    assert values("no-such-command", "") == ([], DIRECTIVE_NO_FILES)


def test_flags_of_a_subcommand_and_their_values():
    flags, directive = values("get", "--")
    assert {"--namespace", "--all-namespaces", "--selector", "--output", "--kubeconfig", "--context"} <= set(flags)
    assert directive == DIRECTIVE_NO_FILES
    assert "--namespace" not in values("get", "-n", "team-a", "--")[0]  # given already
    assert values("get", "-o", "") == (["json", "yaml", "wide"], DIRECTIVE_NO_FILES)
    assert values("get", "-o", "j") == (["json"], DIRECTIVE_NO_FILES)
    assert values("get", "--output=y") == (["--output=yaml"], DIRECTIVE_NO_FILES)  # one word: zsh, kubectl
    assert values("get", "--output", "=", "") == (["json", "yaml", "wide"], DIRECTIVE_NO_FILES)  # bash splits at '='
    assert values("get", "--output", "=") == (["json", "yaml", "wide"], DIRECTIVE_NO_FILES)
    assert values("completion", "") == (["bash", "zsh"], DIRECTIVE_NO_FILES)
    assert values("delete", "--cascade", "") == (["background", "foreground", "orphan"], DIRECTIVE_NO_FILES)


def test_file_arguments_are_left_to_the_shell():
    assert values("plan", "-f", "") == ([], DIRECTIVE_DEFAULT)
    assert values("watch", "--kubeconfig", "") == ([], DIRECTIVE_DEFAULT)
    assert values("from-recipe", "") == ([], DIRECTIVE_DEFAULT)
    assert values("crd", "") == ([], DIRECTIVE_NO_FILES)  # no argument to complete


def test_contexts_come_from_the_kubeconfig_named_on_the_line(tmp_path):
    config = tmp_path / "config"
    config.write_text(
        yaml.safe_dump(
            {
                "contexts": [
                    {"name": "prod", "context": {"cluster": "big"}},
                    {"name": "dev", "context": {"cluster": "small"}},
                ]
            }
        )
    )
    found, directive = complete(build_parser(), ["get", "--kubeconfig", str(config), "--context", ""], NO_CLUSTER)
    assert found == [("prod", "cluster big"), ("dev", "cluster small")] and directive == DIRECTIVE_NO_FILES


def test_without_a_cluster_job_names_complete_to_nothing_and_print_nothing():
    result = run_colocgrpo("__complete", "describe", "--kubeconfig", "/nonexistent/kubeconfig", "")
    assert (result.returncode, result.stdout, result.stderr) == (0, ":4\n", "")
    assert run_colocgrpo("__complete", "get", "-n", "").stdout == ":4\n"


def test_the_answer_is_cobras_format():
    out = run_colocgrpo("__complete", "get", "--sel").stdout
    assert out == "--selector\tonly jobs whose labels match (e.g. team=a)\n:4\n"


def _shell_env() -> dict[str, str]:
    assert (BIN / "colocgrpo").is_file(), f"{BIN / 'colocgrpo'} is not installed: reinstall the venv (`make dev-venv`)"
    return dict(
        os.environ,
        PATH=f"{BIN}:/usr/bin:/bin",
        PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}",
        KUBECONFIG="/nonexistent/kubeconfig",
    )


BASH_DRIVER = """
source <(colocgrpo completion bash)
complete -p colocgrpo >/dev/null || exit 3
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
_colocgrpo_complete
printf '%s\\n' "${COMPREPLY[@]}"
"""


def bash_completes(*words: str) -> list[str]:
    result = subprocess.run(
        ["bash", "-c", BASH_DRIVER, "bash", *words], capture_output=True, text=True, env=_shell_env(), cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completes_through_the_script():
    assert bash_completes("colocgrpo", "des") == ["describe"]
    assert bash_completes("colocgrpo", "get", "-o", "") == ["json", "yaml", "wide"]
    assert bash_completes("colocgrpo", "get", "--output", "=", "y") == ["yaml"]
    assert bash_completes("colocgrpo", "get", "--output", "=") == ["json", "yaml", "wide"]
    assert bash_completes("colocgrpo", "plan", "-f", "examples/tiny") == ["examples/tiny-cpu.yaml"]
    assert bash_completes("colocgrpo", "describe", "") == []  # no cluster: no names, and no files either


ZSH_DRIVER = """
compdef() { :; }
_describe() { local name=${@[-1]}; print -rl -- "${(@P)name}"; }
_files() { print -r -- "<files>"; }
source <(colocgrpo completion zsh)
words=("$@"); CURRENT=$#
_colocgrpo
"""


def zsh_completes(*words: str) -> list[str]:
    result = subprocess.run(
        ["zsh", "-f", "-c", ZSH_DRIVER, "zsh", *words], capture_output=True, text=True, env=_shell_env(), cwd=REPO
    )
    return result.stdout.splitlines()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_through_the_script():
    described = zsh_completes("colocgrpo", "de")
    assert [line.split(":")[0] for line in described] == ["describe", "delete"]
    assert described[0].startswith("describe:show a ColocGRPOJob in full")
    assert zsh_completes("colocgrpo", "get", "--output=") == ["--output=json", "--output=yaml", "--output=wide"]
    assert zsh_completes("colocgrpo", "plan", "-f", "") == ["<files>"]
    assert zsh_completes("colocgrpo", "describe", "") == []
