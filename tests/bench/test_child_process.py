"""bench/child_process.py: a GPU-holding child and everything it started go when the
limit passes, and its output lands in the work folder."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.child_process import run_child


def test_child_output_and_exit_code(tmp_path):
    code, timed_out = run_child(
        [sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"], dict(os.environ), tmp_path, 30
    )
    assert (code, timed_out) == (3, False)
    assert (tmp_path / "stdout.log").read_text() == "hi\n"


def test_timeout_takes_down_the_whole_process_group(tmp_path):
    # The child starts a grandchild (as accelerate starts its workers) and both sleep.
    script = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(tmp_path / 'grandchild.pid')!r}, 'w').write(str(p.pid));"
        "time.sleep(60)"
    )
    start = time.monotonic()
    code, timed_out = run_child([sys.executable, "-c", script], dict(os.environ), tmp_path, 2)
    assert timed_out and code != 0
    assert time.monotonic() - start < 30
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    for _ in range(50):  # killed: gone, or a zombie where PID 1 does not reap
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"grandchild {grandchild} outlived the timeout")
