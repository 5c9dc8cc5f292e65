"""Which checkpoint every rank resumes from, and how a stopping process exits.

Each rank lists the checkpoint folder itself; listings of one shared volume can differ
(a lagging listing, a marker not yet visible), and DeepSpeed's load is a collective: the
ranks agree on the newest step that every rank sees complete, or all fail with one clear error.
The whole trainer at world size 4 is in test_multirank.py; here the agreement runs in 4
gloo processes, each with its own view of the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from colocgrpo_training.checkpoints import COMPLETE_MARKER, ResumeDisagreementError, common_resume_step
from colocgrpo_training.failures import EXIT_TERMINATED
from support import gloo_world

pytestmark = pytest.mark.trainer

TRAINING = Path(__file__).resolve().parents[2] / "training"


def test_common_resume_step():
    assert common_resume_step([[], [], []]) is None  # a fresh start
    assert common_resume_step([[2, 4], [2, 4]]) == 4
    assert common_resume_step([[2, 4], [2], [2, 4, 6]]) == 2  # the newest step every rank sees
    with pytest.raises(ResumeDisagreementError, match=r"rank 0: \[4\]; rank 1: none") as caught:
        common_resume_step([[4], []], "/checkpoints/job")
    assert "checkpoint.dir /checkpoints/job" in str(caught.value)
    with pytest.raises(ResumeDisagreementError):
        common_resume_step([[2], [4]])


def _checkpoint(folder: Path, step: int, complete: bool = True) -> None:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        (path / COMPLETE_MARKER).write_text(f"{step}\n")


def test_ranks_with_different_listings_agree_or_all_fail_alike(tmp_path):
    views = {
        # rank 2's listing lags behind step 4; rank 3 sees step 4 without its marker yet.
        "lagging": {0: [2, 4], 1: [2, 4], 2: [2], 3: [2, (4, False)]},
        # Rank 3 sees nothing: an unshared volume, say.
        "private": {0: [4], 1: [4], 2: [4], 3: []},
        "fresh": {0: [], 1: [], 2: [], 3: []},
    }
    roots = {}
    for case, by_rank in views.items():
        for rank, steps in by_rank.items():
            folder = tmp_path / case / f"rank{rank}"
            folder.mkdir(parents=True)
            for item in steps:
                step, complete = item if isinstance(item, tuple) else (item, True)
                _checkpoint(folder, step, complete)
        roots[case] = str(tmp_path / case)
    out = tmp_path / "out"
    out.mkdir()
    gloo_world.run_world(gloo_world.resume_agreement, 4, roots, str(out))
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]
    assert [r["lagging"] for r in results] == [{"checkpoint": "checkpoint-2"}] * 4
    assert [r["fresh"] for r in results] == [{"checkpoint": None}] * 4
    # Every rank fails, with the same account of what each rank sees (and its own folder's path).
    for rank, result in enumerate(results):
        error = result["private"].get("error") or ""
        assert f"private/rank{rank}: no checkpoint is complete on every rank" in error, result
        assert "(rank 0: [4]; rank 1: [4]; rank 2: [4]; rank 3: none)" in error


# A process on the EXIT_TERMINATED path, and a SIGTERM while its interpreter shuts down (from a
# finalizer: Python's own signal handlers are gone by then), as torch's launcher sends one to
# every rank still running once one rank has exited.
STOPPING_PROCESS = """
import os, signal, sys
from colocgrpo_training.checkpoints import TerminationRequest


class SignalDuringShutdown:
    # Bound now: module globals may be gone when this runs.
    def __del__(self, kill=os.kill, pid=os.getpid(), sigterm=signal.SIGTERM):
        kill(pid, sigterm)


late = SignalDuringShutdown()
request = TerminationRequest()
request.install()
if sys.argv[1] == "stopping":
    request.ignore_further()  # what the entrypoint does before returning EXIT_TERMINATED
sys.exit(143)
"""


def test_a_stopping_process_keeps_its_exit_code_through_a_late_sigterm():
    # This checkout's trainer, whatever a venv has installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINING), os.environ.get("PYTHONPATH", "")])}
    stopping = subprocess.run([sys.executable, "-c", STOPPING_PROCESS, "stopping"], env=env, timeout=120)
    assert stopping.returncode == EXIT_TERMINATED
    # The same process without it dies by the signal: what the launcher would report for that rank.
    unguarded = subprocess.run([sys.executable, "-c", STOPPING_PROCESS, "unguarded"], env=env, timeout=120)
    assert unguarded.returncode == -signal.SIGTERM
