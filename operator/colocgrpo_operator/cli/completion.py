"""`colocgrpo completion bash|zsh`: the shell completion script; load it with
`source <(colocgrpo completion bash)` (or zsh), or save it where the shell loads completions from.

It completes subcommands, flags and their values (the -o formats, the kubeconfig's contexts, files),
and, where a command takes a job's name, the names of the jobs in the namespace from the cluster
(the -n, --kubeconfig and --context typed so far apply). The script asks `colocgrpo __complete WORDS`,
which answers as cobra's programs do (kubectl's own completion among them): one candidate a line
(`value<TAB>description`), then `:DIRECTIVE`. `kubectl colocgrpo <TAB>` completes through the same
answer: kubectl runs the `kubectl_complete-colocgrpo` program this package installs beside the plugin.

Exit status: 0; 2 a usage error (an unknown shell).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# cobra's ShellCompDirective bits (kubectl's plugin completion reads them).
DIRECTIVE_DEFAULT = 0  # nothing to offer: the shell completes file names
DIRECTIVE_NO_FILES = 4  # these candidates only, no file names
# Seconds a cluster lookup may take before completion gives up on it (a tab press must not hang).
LOOKUP_TIMEOUT = 2.0
# Flags whose value is a file.
FILE_FLAGS = {"filename", "kubeconfig", "output_file"}

BASH_SCRIPT = r"""# bash completion for colocgrpo and kubectl-colocgrpo
# Load it:  source <(colocgrpo completion bash)
# Keep it:  colocgrpo completion bash > ~/.local/share/bash-completion/completions/colocgrpo
_colocgrpo_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" line directive
    local -a lines values=()
    mapfile -t lines < <("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null)
    (( ${#lines[@]} )) || return 0
    directive="${lines[${#lines[@]}-1]#:}"
    [[ $directive =~ ^[0-9]+$ ]] || return 0
    unset 'lines[${#lines[@]}-1]'
    for line in "${lines[@]}"; do
        [[ -n $line ]] && values+=("${line%%$'\t'*}")
    done
    if (( ${#values[@]} == 0 )); then
        (( directive & 4 )) && return 0
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        return 0
    fi
    [[ $cur == "=" ]] && cur=""
    mapfile -t COMPREPLY < <(compgen -W "${values[*]}" -- "$cur")
}
complete -o nosort -F _colocgrpo_complete colocgrpo kubectl-colocgrpo 2>/dev/null \
    || complete -F _colocgrpo_complete colocgrpo kubectl-colocgrpo
"""

ZSH_SCRIPT = r"""#compdef colocgrpo kubectl-colocgrpo
# zsh completion for colocgrpo and kubectl-colocgrpo
# Load it:  source <(colocgrpo completion zsh)          (after compinit)
# Keep it:  colocgrpo completion zsh > "${fpath[1]}/_colocgrpo"
_colocgrpo() {
    local -a lines described
    local line directive value
    lines=("${(@f)$("${words[1]}" __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    (( ${#lines} )) || return 1
    directive="${lines[-1]#:}"
    [[ $directive == <-> ]] || return 1
    for line in "${(@)lines[1,-2]}"; do
        [[ -n $line ]] || continue
        value="${line%%$'\t'*}"
        value="${value//:/\\:}"
        if [[ $line == *$'\t'* ]]; then
            described+=("${value}:${line#*$'\t'}")
        else
            described+=("${value}")
        fi
    done
    if (( ${#described} == 0 )); then
        (( directive & 4 )) && return 1
        _files
        return
    fi
    _describe -t values colocgrpo described
}
if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    _colocgrpo "$@"
else
    compdef _colocgrpo colocgrpo kubectl-colocgrpo
fi
"""

SCRIPTS = {"bash": BASH_SCRIPT, "zsh": ZSH_SCRIPT}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print the bash or zsh completion script",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", choices=sorted(SCRIPTS), help="the shell to complete in")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(SCRIPTS[args.shell])
    return 0


# -- the answer to `__complete` ------------------------------------------------------------------


def _summary(text: str | None) -> str:
    """A flag's or command's help, cut to a short description."""
    first = " ".join((text or "").split())
    if first in ("", argparse.SUPPRESS):
        return ""
    return first if len(first) <= 70 else first[:67].rstrip() + "..."


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: _summary(choice.help) for choice in action._choices_actions}


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    return parser._option_string_actions.get(word)


def _takes_value(action: argparse.Action) -> bool:
    """Whether the flag reads the next word as its value (`-n NS`; not `-f`, not `--wait[=BOOL]`)."""
    return action.nargs is None


class _Line:
    """What the words typed after the subcommand say: the flags given (with values), the positionals."""

    def __init__(self, parser: argparse.ArgumentParser, words: Sequence[str]):
        self.values: dict[str, str] = {}
        self.used: set[str] = set()
        self.positionals: list[str] = []
        self.pending: argparse.Action | None = None  # a flag whose value is the word being completed
        only_positionals = False
        index = 0
        while index < len(words):
            word = words[index]
            index += 1
            if word == "=" and self.pending is not None:
                continue  # bash splits `--flag=value` at '='
            if self.pending is not None:
                self.values[self.pending.dest] = word
                self.pending = None
                continue
            if only_positionals or not word.startswith("-") or word == "-":
                self.positionals.append(word)
                continue
            if word == "--":
                only_positionals = True
                continue
            flag, has_value, value = word.partition("=")
            action = _option(parser, flag)
            if action is None:
                continue
            self.used.add(action.dest)
            if has_value:
                self.values[action.dest] = value
            elif _takes_value(action):
                self.pending = action


def _cluster_api(line: _Line) -> Any:
    from colocgrpo_operator.kube.client import KubeApi

    return KubeApi.from_kubeconfig(
        line.values.get("kubeconfig"),
        field_manager="colocgrpo-completion",
        context=line.values.get("context"),
        timeout=LOOKUP_TIMEOUT,
        retry_budget=0,
    )


def _job_names(line: _Line) -> list[tuple[str, str]]:
    """The jobs of the namespace the line names (or the context's), each with its phase and step."""
    from colocgrpo_operator.client import ColocGRPOClient

    with ColocGRPOClient(line.values.get("namespace"), api=_cluster_api(line)) as client:
        found = []
        for state in client.list():
            step = f" step {state.step}/{state.max_steps}" if state.step is not None else ""
            found.append((state.name, f"{state.phase or 'new'}{step}"))
        return found


def _namespaces(line: _Line) -> list[tuple[str, str]]:
    api = _cluster_api(line)
    try:
        listing = api.request("GET", "/api/v1/namespaces") or {}
    finally:
        api.close()
    return [(str(item["metadata"]["name"]), "") for item in listing.get("items") or []]


def _contexts(line: _Line, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    from pathlib import Path

    import yaml

    source = line.values.get("kubeconfig") or environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    names: list[tuple[str, str]] = []
    for path in source.split(os.pathsep):
        try:
            config = yaml.safe_load(Path(path).expanduser().read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for entry in config.get("contexts") or [] if isinstance(config, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                cluster = (entry.get("context") or {}).get("cluster") if isinstance(entry.get("context"), dict) else ""
                names.append((entry["name"], f"cluster {cluster}" if cluster else ""))
    return names


def _looked_up(lookup: Any, *args: Any) -> list[tuple[str, str]]:
    """A lookup's candidates, none when it fails: a tab press never prints an error."""
    try:
        return list(lookup(*args))
    except Exception:
        return []


def _values(action: argparse.Action, line: _Line, environ: Mapping[str, str]) -> tuple[list[tuple[str, str]], int]:
    """The candidates for a flag's value."""
    if action.choices:
        return [(str(choice), "") for choice in action.choices], DIRECTIVE_NO_FILES
    if action.dest == "namespace":
        return _looked_up(_namespaces, line), DIRECTIVE_NO_FILES
    if action.dest == "context":
        return _looked_up(_contexts, line, environ), DIRECTIVE_NO_FILES
    if action.dest in FILE_FLAGS:
        return [], DIRECTIVE_DEFAULT
    return [], DIRECTIVE_NO_FILES


def complete(
    parser: argparse.ArgumentParser, words: Sequence[str], environ: Mapping[str, str] = os.environ
) -> tuple[list[tuple[str, str]], int]:
    """The candidates (value, description) for the last of `words`, the words after the program's name
    (the last one is being typed, maybe empty), and cobra's directive for the shell."""
    *before, current = list(words) or [""]
    commands = _subcommands(parser)
    command_index = next((i for i, word in enumerate(before) if not word.startswith("-")), None)
    if command_index is None:
        if current.startswith("-"):
            flags = [("--help", "show the help"), ("--version", "show the version")]
            return [(flag, text) for flag, text in flags if flag.startswith(current)], DIRECTIVE_NO_FILES
        helps = _subcommand_help(parser)
        return [(name, helps.get(name, "")) for name in commands if name.startswith(current)], DIRECTIVE_NO_FILES
    sub = commands.get(before[command_index])
    if sub is None:
        return [], DIRECTIVE_NO_FILES
    line = _Line(sub, before[command_index + 1 :])

    if line.pending is not None:  # `-n <TAB>`, or bash's `--output = <TAB>`
        prefix = "" if current == "=" else current
        found, directive = _values(line.pending, line, environ)
        return [(value, text) for value, text in found if value.startswith(prefix)], directive
    if current.startswith("-") and "=" in current:  # `--output=js<TAB>` as one word (zsh, kubectl)
        flag, _, prefix = current.partition("=")
        action = _option(sub, flag)
        if action is None:
            return [], DIRECTIVE_NO_FILES
        found, directive = _values(action, line, environ)
        return [(f"{flag}={value}", text) for value, text in found if value.startswith(prefix)], directive
    if current.startswith("-"):
        found = []
        for action in sub._actions:
            if action.dest in line.used and not isinstance(action, argparse._AppendAction):
                continue
            long_flags = [flag for flag in action.option_strings if flag.startswith("--")]
            for flag in long_flags or action.option_strings:
                if flag.startswith(current):
                    found.append((flag, _summary(action.help)))
        return found, DIRECTIVE_NO_FILES

    positionals = [action for action in sub._actions if not action.option_strings]
    if not positionals:
        return [], DIRECTIVE_NO_FILES
    index = len(line.positionals)
    action = positionals[min(index, len(positionals) - 1)]
    if index >= len(positionals) and action.nargs not in ("*", "+"):
        return [], DIRECTIVE_NO_FILES
    if action.choices:
        return [(str(c), "") for c in action.choices if str(c).startswith(current)], DIRECTIVE_NO_FILES
    if action.dest in ("name", "names"):
        typed = set(line.positionals)
        names = _looked_up(_job_names, line)
        return [(n, text) for n, text in names if n.startswith(current) and n not in typed], DIRECTIVE_NO_FILES
    return [], DIRECTIVE_DEFAULT


def answer(parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """The text of `__complete WORDS`: `value<TAB>description` lines, then `:DIRECTIVE`."""
    found, directive = complete(parser, words)
    lines = [f"{value}\t{text}" if text else value for value, text in found]
    return "".join(f"{line}\n" for line in lines) + f":{directive}\n"
