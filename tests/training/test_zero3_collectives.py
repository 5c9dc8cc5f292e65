"""bench.zero3_collectives: ZeRO-3's collectives per optimizer step, counted at two ranks that train on rows of
different lengths, under the operator's multi-GPU ZeRO section and with every parameter persistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_two_ranks_with_different_rows_issue_the_same_collectives_and_persistence_cuts_them(
    tmp_path, trainer_env
) -> None:
    out = tmp_path / "collectives"
    env = trainer_env(tmp_path)
    # The checkout's packages, none of which the trainer venv has installed.
    env["PYTHONPATH"] = f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{REPO / 'dev'}"
    command = [sys.executable, "-m", "bench.zero3_collectives", "--out", str(out), "--world", "2", "--layers", "2"]
    done = subprocess.run(
        [*command, "--hidden", "64", "--files", "auto,persist", "--timeout", "300"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=700,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "collectives.json").read_text())
    auto, persist = report["sections"]["auto"], report["sections"]["persist"]
    for section in (auto, persist):
        assert section["equal_on_every_rank"], section
        assert len(set(section["tokens_per_row_by_rank"])) == 2, section  # the ranks' rows differ in length
    # Released parameters are fetched again in the backward and the checkpointed recompute; persistent ones never
    # are, and their gradients go in one bucket instead of one reduce-scatter per released parameter.
    assert 0 < persist["calls"]["all_gather"] < auto["calls"]["all_gather"], (auto, persist)
    assert 0 < persist["calls"]["reduce_scatter"] < auto["calls"]["reduce_scatter"], (auto, persist)
    assert persist["persistent_parameters"].split(" of ")[0] == persist["persistent_parameters"].split(" of ")[1]
    assert "| auto | " in done.stdout and "| persist | " in done.stdout, done.stdout
