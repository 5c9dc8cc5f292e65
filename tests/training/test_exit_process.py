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
