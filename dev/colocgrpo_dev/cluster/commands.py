"""Running the cluster's command-line tools with errors that say what went wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


class CommandFailed(subprocess.CalledProcessError):
    """CalledProcessError whose message carries the tool's own output (kubectl/kwokctl errors)."""

    def __str__(self) -> str:
        output = "\n".join(part.strip() for part in (self.stderr, self.output) if part and part.strip())
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n{output}"


def run(
    cmd: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), input=input, capture_output=True, text=True, env=env)
    if check and done.returncode:
        raise CommandFailed(done.returncode, done.args, done.stdout, done.stderr)
    return done


# `python -m colocgrpo_operator` is `colocgrpo-operator`, from whatever checkout PYTHONPATH names.
OPERATOR_COMMAND = ("colocgrpo_operator",)


def start_operator(
    checkout: Path,
    kubeconfig: str | Path,
    flags: Sequence[str],
    log_path: Path,
    *,
    append: bool = False,
    runner: Sequence[str] = OPERATOR_COMMAND,
    extra_paths: Sequence[Path] = (),
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`colocgrpo-operator --kubeconfig=KUBECONFIG FLAGS...` in a child process that imports the
    code of `checkout` (its operator/ and training/ first on PYTHONPATH), output into `log_path`.

    How the demo, the operator tests and the 500-job benchmark run the operator: as a real
    process, the way the chart's Deployment does. `append` keeps the log of an earlier start.
    A test may run a wrapper module instead (`runner`: what `python -m` runs, with its leading
    arguments), with more import paths and environment.
    """
    path = ":".join(str(p) for p in (checkout / "operator", checkout / "training", *extra_paths))
    env = dict(os.environ, PYTHONPATH=path, **(extra_env or {}))
    command = [sys.executable, "-m", *runner, f"--kubeconfig={kubeconfig}", *flags]
    with open(log_path, "ab" if append else "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=checkout)


def stop_process(process: subprocess.Popen[bytes] | None, grace: float = 20) -> None:
    """SIGTERM a child started by start_operator and wait; SIGKILL it after `grace` seconds."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
