"""Children that hold the GPU (an `accelerate launch` and its workers), run so that they
never outlive the driver: each in its own process group, killed as a group on a timeout
or when the driver itself is stopped. Used by bench/grpo/ and tests/gpu/drivers/learning_run.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ACTIVE_CHILD: list[subprocess.Popen] = []


def stop_children(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT handler (e.g. from `timeout`): take the child's process group down
    too — it runs in its own session and would otherwise outlive us, holding the GPU."""
    for proc in ACTIVE_CHILD:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def install_stop_handlers() -> None:
    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)


def run_child(cmd: list[str], env: dict, work: Path, timeout_s: float, cwd: Path | None = None) -> tuple[int, bool]:
    """Run `cmd` in its own process group with stdout/stderr in work/stdout.log and
    work/stderr.log. Returns (exit code, timed out); on timeout the whole group goes."""
    with open(work / "stdout.log", "w") as out, open(work / "stderr.log", "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        ACTIVE_CHILD[:] = [proc]
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, True
