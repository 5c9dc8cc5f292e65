"""The operator as a real child process, the way the chart's Deployment runs it: what the operator tests,
the chaos and fuzz benchmarks and the 500-job benchmark start, kill and restart."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from colocgrpo_dev.cluster.commands import OPERATOR_COMMAND, start_operator, stop_process
from colocgrpo_dev.ports import free_port

REPO = Path(__file__).resolve().parents[2]


class OperatorProcess:
    """`colocgrpo-operator` watching some namespaces, from a checkout's code: start, SIGKILL, restart, stop.

    Its liveness and metrics ports are free local ports picked at each start; its log accumulates across
    restarts, so `log_mark` / `log_since` can read what one restart wrote.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        log_path: Path,
        *,
        checkout: Path = REPO,
        recheck_seconds: float | None = 2,
        trainer_image: str | None = "colocgrpo/trainer:test",
        extra_args: Sequence[str] = (),
        runner: Sequence[str] = OPERATOR_COMMAND,
        extra_paths: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ):
        """`checkout`: whose operator/ and training/ the process imports; `recheck_seconds`,
        `trainer_image`: those flags (None: the operator's default); `extra_args`: more flags;
        `runner`: the module `python -m` runs, with its leading arguments (a test may wrap the operator);
        `extra_paths`: more import paths for it; `env`: more environment."""
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_path = log_path
        self.checkout = checkout
        self.recheck_seconds = recheck_seconds
        self.trainer_image = trainer_image
        self.extra_args = tuple(extra_args)
        self.runner = tuple(runner)
        self.extra_paths = tuple(extra_paths)
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.liveness_port = 0
        self.metrics_port = 0

    def start(self, timeout: float = 90) -> None:
        """Start it and wait until /healthz answers; raises with the log's tail if it exits or never does."""
        self.liveness_port, self.metrics_port = free_port(), free_port()
        flags = [f"--liveness-port={self.liveness_port}", f"--metrics-port={self.metrics_port}"]
        if self.recheck_seconds is not None:
            flags.append(f"--recheck-seconds={self.recheck_seconds:g}")
        if self.trainer_image is not None:
            flags.append(f"--trainer-image={self.trainer_image}")
        flags += [f"--namespace={namespace}" for namespace in self.namespaces]
        flags += self.extra_args
        self.process = start_operator(
            self.checkout,
            self.kubeconfig,
            flags,
            self.log_path,
            append=True,
            runner=self.runner,
            extra_paths=self.extra_paths,
            extra_env=self.env,
        )
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"operator not live after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        """Whether /healthz answers 200 now."""
        return self.probe("/healthz")[0] == 200

    def probe(self, path: str = "/readyz") -> tuple[int, str]:
        """(status, body) of a probe endpoint; (0, reason) when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}{path}", timeout=5) as response:
                return response.status, response.read().decode().strip()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode().strip()
        except OSError as error:
            return 0, str(error)

    def metrics(self) -> str:
        """The Prometheus text its metrics endpoint serves now."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def state(self) -> str:
        """One line for a timeout's message: whether the process runs (its state letter and memory) or how it
        ended, how long ago its log was last written, and what /healthz answers."""
        if self.process is None:
            return "operator: never started"
        if self.process.poll() is not None:
            return f"operator pid {self.process.pid}: exited with {self.process.returncode}"
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
            )
            running = f"{fields['State'].split()[0]} {int(fields['VmRSS'].split()[0]) // 1024} MiB"
        except (OSError, KeyError, ValueError):
            running = "?"
        try:
            quiet = f"{time.time() - self.log_path.stat().st_mtime:.0f} s ago"
        except OSError:
            quiet = "never"
        status, body = self.probe("/healthz")
        return (
            f"operator pid {self.process.pid}: running ({running}), log last written {quiet}, "
            f"/healthz {status} {body[:80]}"
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizer removal, mid-whatever-it-was-doing."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops a container; SIGKILL if it does not exit in time."""
        stop_process(self.process)

    def log_mark(self) -> int:
        """Where the log ends now (for `log_since`)."""
        return len(self.log_path.read_text(errors="replace"))

    def log_since(self, mark: int) -> str:
        return self.log_path.read_text(errors="replace")[mark:]

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def tracebacks(self) -> list[str]:
        """Every traceback in the log, with the line before it (what was logged)."""
        lines = self._lines()
        return [" | ".join(lines[max(0, i - 1) : i + 4]) for i, line in enumerate(lines) if "Traceback" in line]

    def errors(self) -> list[str]:
        """Every ERROR (or CRITICAL) line in the log."""
        return [line for line in self._lines() if " ERROR " in line or " CRITICAL " in line]

    def _lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
