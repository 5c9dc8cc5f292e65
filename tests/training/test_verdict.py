"""One verdict on failure (verdict.py): the first failure of any rank ends every rank, with that rank's cause, also
the ranks that wait in a collective the failed rank never joins.

Processes of a gloo world (`support.gloo_world.verdict_rank`), each with its own termination message. The failing
rank stays alive after reporting, so the waiting ranks' collective never fails by itself (a peer's exit breaks a gloo
collective, not always an NCCL one): only their verdict watch can end them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colocgrpo_dev.ports import free_port
from colocgrpo_training.failures import Failure
from colocgrpo_training.verdict import GRACE_SECONDS, POLL_SECONDS, Verdict
from support.shared_stream import lines_written_together

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]


def start_world(tmp_path: Path, behaviours: list[str]) -> list[subprocess.Popen]:
    port = free_port()
    processes = []
    for rank, behaviour in enumerate(behaviours):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(len(behaviours)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("tests", "training", "operator", "dev")),
            "COLOCGRPO_TERMINATION_LOG": str(tmp_path / f"termination-log-{rank}"),
        }
        code = f"from support.gloo_world import verdict_rank; verdict_rank({behaviour!r})"
        log = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 - the child writes it; closed with the test
        processes.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=log))
    return processes


def wait_for(processes: list[subprocess.Popen], ranks: list[int], limit_s: float) -> dict[int, float]:
    """When each of `ranks` ended (monotonic), waiting at most `limit_s`; kills every process at the end."""
    ended: dict[int, float] = {}
    deadline = time.monotonic() + limit_s
    try:
        while len(ended) < len(ranks) and time.monotonic() < deadline:
            for rank in ranks:
                if rank not in ended and processes[rank].poll() is not None:
                    ended[rank] = time.monotonic()
            time.sleep(0.1)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    return ended


def messages(tmp_path: Path, world: int) -> dict[int, dict]:
    return {rank: json.loads((tmp_path / f"termination-log-{rank}").read_text()) for rank in range(world)}


def test_ranks_waiting_in_a_collective_end_with_the_failed_ranks_verdict(tmp_path):
    processes = start_world(tmp_path, ["wait", "fail", "wait"])
    reported = tmp_path / "termination-log-1"
    deadline = time.monotonic() + 120
    while not reported.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reported.exists(), (tmp_path / "rank1.log").read_text()
    failed_at = time.monotonic()
    ended = wait_for(processes, [0, 2], limit_s=60)
    logs = {rank: (tmp_path / f"rank{rank}.log").read_text() for rank in range(3)}
    assert sorted(ended) == [0, 2], logs
    assert [processes[rank].returncode for rank in (0, 2)] == [1, 1], logs
    # The rank's own main thread cannot report: its watch does, after the grace it gives the main thread.
    assert all(ended[rank] - failed_at <= GRACE_SECONDS + POLL_SECONDS + 10 for rank in (0, 2)), ended
    assert "did not stop within" in logs[0] and "did not stop within" in logs[2]
    expected = {
        "reason": "TrainerError",
        "message": "rank 1 failed in a test stage: ValueError: fail on rank 1",
    }
    assert messages(tmp_path, 3) == dict.fromkeys(range(3), expected)
    assert all(f"colocgrpo: TrainerError: {expected['message']}" in log for log in logs.values())


def test_the_first_failure_is_the_verdict_of_every_rank(tmp_path):
    processes = start_world(tmp_path, ["fail", "wait", "fail-later"])
    ended = wait_for(processes, [1, 2], limit_s=120)
    logs = {rank: (tmp_path / f"rank{rank}.log").read_text() for rank in range(3)}
    assert sorted(ended) == [1, 2], logs
    expected = {"reason": "TrainerError", "message": "rank 0 failed in a test stage: ValueError: fail on rank 0"}
    # Rank 2 failed too, 2 s later and for its own reason: it reports rank 0's failure.
    assert messages(tmp_path, 3) == dict.fromkeys(range(3), expected), logs
    assert "ValueError: fail-later on rank 2" in logs[2]  # its own traceback is still in its log


@pytest.mark.parametrize(
    ("verdict", "message"),
    [
        (
            Verdict(Failure("DataError", "bad row"), rank=2, world=4, stage="in setup"),
            "rank 2 failed in setup: bad row",
        ),
        (
            Verdict(Failure("DataError", "bad row"), rank=-1, world=4, stage="in setup"),
            "every rank stopped in setup: bad row",
        ),
        (Verdict(Failure("DataError", "bad row"), rank=0, world=1, stage="in setup"), "bad row"),
        (Verdict(Failure("DataError", "bad row"), rank=3, world=4), "rank 3 failed: bad row"),
    ],
)
def test_the_verdicts_message_says_who_failed_where(verdict, message):
    assert verdict.message() == message
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert verdict.reported() == Failure("DataError", message)


# A rank's writer; the test puts `RANK = <rank>` before it.
SAYER = """
import sys
from colocgrpo_training.console import say_line
print("ready", flush=True)
sys.stdin.read()  # the start signal: every writer begins together
for i in range(300):
    say_line(f"colocgrpo: DataError: rank {RANK} line {i} " + "x" * 900, sys.stderr)
"""


def test_verdict_lines_of_ranks_sharing_one_stderr_never_interleave() -> None:
    """Four processes, unbuffered as the pods run them, write 300 verdict-sized lines each into one pipe: every line
    comes out whole (with print, the text and its newline are two writes, and lines of two ranks merge)."""
    lines = lines_written_together([f"RANK = {rank}\n{SAYER}" for rank in range(4)], "stderr")
    expected = {f"colocgrpo: DataError: rank {rank} line {i} " + "x" * 900 for rank in range(4) for i in range(300)}
    assert len(lines) == len(expected) and set(lines) == expected, [line[:60] for line in lines if line not in expected]
