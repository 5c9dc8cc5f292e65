"""`exit_process`: the trainer process ends as Python's exit would, less the interpreter's finalization.

The abort it prevents (a torch process-group thread releasing a finished collective during finalization) is a race;
test_old_logps_multirank.py's launches end through it at world size 2, where an abort fails the launch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.trainer

SCRIPT = textwrap.dedent(
    """
    import atexit, pathlib, sys, threading

    from colocgrpo_training.entrypoint import exit_process

    out = pathlib.Path(sys.argv[1])


    class Finalized:
        def __del__(self):
            (out / "finalized").write_text("the interpreter's finalization ran")


    kept = Finalized()  # a module global: released only by the interpreter's finalization
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    go = threading.Event()


    def worker():
        go.wait()
        (out / "thread").write_text("finished")


    threading.Thread(target=worker).start()  # not a daemon: exit waits for it
    go.set()
    sys.stdout.write("buffered, no newline")  # stdout is a pipe here: block-buffered
    exit_process(int(sys.argv[2]))
    """
)


@pytest.mark.parametrize("code", [0, 143])
def test_exit_keeps_the_code_threads_atexit_and_output_and_skips_finalization(tmp_path, code):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == code, result.stderr
    assert result.stdout == "buffered, no newline"
    assert (tmp_path / "thread").read_text() == "finished"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "finalized").exists()


PYTEST_FILE = textwrap.dedent(
    """
    import os, pathlib


    class Finalized:
        # What it needs is bound here: by the time finalization releases it, module globals may be gone.
        def __del__(self, write=pathlib.Path(os.environ["OUT"], "finalized").write_text):
            write("the interpreter's finalization ran")


    kept = Finalized()


    def test_outcome():
        assert os.environ["OUTCOME"] == "pass"
    """
)


@pytest.mark.parametrize(("outcome", "code"), [("pass", 0), ("fail", 1)])
def test_the_gpu_suites_pytest_plugin_exits_with_pytests_status_after_its_reports(tmp_path, outcome, code):
    """tests/gpu/drivers/pytest_exit.py, as run_on_device.sh loads it into every pytest process of the GPU suites."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "test_suite.py").write_text(PYTEST_FILE)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{repo}:{repo / 'training'}",
        "OUT": str(tmp_path),
        "OUTCOME": outcome,
    }
    options = ["-p", "tests.gpu.drivers.pytest_exit", "-p", "no:cacheprovider", "--noconftest"]
    options += [f"--junitxml={tmp_path / 'junit.xml'}", str(tmp_path / "test_suite.py")]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == code, result.stdout + result.stderr
    assert f"1 {'passed' if code == 0 else 'failed'}" in result.stdout  # the summary, written before the exit
    assert 'tests="1"' in (tmp_path / "junit.xml").read_text()
    assert not (tmp_path / "finalized").exists()
