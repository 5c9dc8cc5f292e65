"""`colocgrpo-launch` ends with the exit code every rank of the pod recorded (training/colocgrpo_training/launch.py).

The pure part: which records make an agreement. The launch itself, through the pod command, is in
test_pod_preemption.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colocgrpo_training.launch import EXIT_CODES_ENV, agreed_exit_code, record_exit_code


def _record(folder: Path, monkeypatch: pytest.MonkeyPatch, rank: int, size: int, code: int) -> None:
    monkeypatch.setenv(EXIT_CODES_ENV, str(folder))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(size))
    record_exit_code(code)


def test_every_rank_with_one_code_agrees(tmp_path, monkeypatch):
    for rank in range(4):
        _record(tmp_path, monkeypatch, rank, 4, 143)
    assert agreed_exit_code(tmp_path) == 143
    assert json.loads((tmp_path / "rank-3.json").read_text()) == {"code": 143, "localWorldSize": 4}


@pytest.mark.parametrize(
    ("records", "why"),
    [
        ([(0, 4, 143), (1, 4, 143), (2, 4, 143)], "a rank recorded nothing (killed)"),
        ([(0, 2, 143), (1, 2, 1)], "the ranks differ"),
        ([], "no rank recorded"),
    ],
)
def test_no_agreement(tmp_path, monkeypatch, records, why):
    for rank, size, code in records:
        _record(tmp_path, monkeypatch, rank, size, code)
    assert agreed_exit_code(tmp_path) is None, why


def test_nothing_is_recorded_without_a_launcher(tmp_path, monkeypatch):
    monkeypatch.delenv(EXIT_CODES_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record_exit_code(143)
    assert list(tmp_path.iterdir()) == []


def test_a_process_ending_through_exit_process_records_its_code(tmp_path):
    # The trainer's own way out (entrypoint.exit_process) records the code before the process ends.
    env = dict(os.environ, **{EXIT_CODES_ENV: str(tmp_path), "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    code = "from colocgrpo_training.entrypoint import exit_process; exit_process(143)"
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 143
    assert json.loads((tmp_path / "rank-1.json").read_text()) == {"code": 143, "localWorldSize": 2}
