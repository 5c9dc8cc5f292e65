"""Processes writing one pipe together, as the ranks of a pod share its stdout and stderr.

Each writer is `python -c SCRIPT`, unbuffered as the pods run Python. Once it has imported what it needs, a script
prints `ready` on its other stream (stderr when the shared one is stdout, stdout otherwise) and reads stdin to its
end: closing every writer's stdin then starts their lines at once, so that they contend for the pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lines_written_together(scripts: list[str], stream: str = "stdout", timeout_s: float = 120) -> list[str]:
    """Run every script with `stream` ("stdout" or "stderr") on one pipe, start them together, and return the
    pipe's lines once every writer has exited 0. A script announces itself with `ready` on the other stream."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO / 'training'}:{REPO / 'operator'}"}
    read, write = os.pipe()
    shared, other = (
        ({"stdout": write}, {"stderr": subprocess.PIPE})
        if stream == "stdout"
        else ({"stderr": write}, {"stdout": subprocess.PIPE})
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, env=env, text=True, **shared, **other)
        for script in scripts
    ]
    os.close(write)
    for writer in writers:
        announced = writer.stderr if stream == "stdout" else writer.stdout
        assert announced is not None and announced.readline() == "ready\n"
    for writer in writers:
        assert writer.stdin is not None
        writer.stdin.close()
    with os.fdopen(read, "rb") as pipe:
        lines = pipe.read().decode().splitlines()
    assert [writer.wait(timeout=timeout_s) for writer in writers] == [0] * len(writers)
    return lines
