"""`python -m bench.generate_profile --cpu` with its time budget already spent: nothing is measured, and the report
says why. The profile measured end to end on CPU is the GPU driver's gen-profile part
(tests/training/test_gpu_dry_run.py), which runs this module the way the GPU machine does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def profile_env(trainer_env, tmp_path: Path, model: Path) -> dict[str, str]:
    """The profile's environment: the checkout's packages, none of which the trainer venv has installed, tests/ for
    the vLLM stand-in, and the tiny model as the cpu size's model."""
    env = trainer_env(tmp_path)
    env["PYTHONPATH"] = ":".join(str(REPO / sub) for sub in ("", "operator", "training", "dev", "tests"))
    env["COLOCGRPO_TEST_MODEL"] = str(model)
    return env


def run_profile(env: dict[str, str], out, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench.generate_profile --cpu --out OUT ARGS...` in the trainer venv, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "bench.generate_profile", "--cpu", "--out", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_a_budget_already_spent_skips_every_variant_and_says_so(tmp_path, trainer_env, tiny_model_dir):
    out = tmp_path / "profile"
    done = run_profile(profile_env(trainer_env, tmp_path, tiny_model_dir), out, "--budget-seconds", "0")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # nothing measured: not a success
    report = json.loads((out / "generate_profile.json").read_text())
    assert all(v["status"].startswith("skipped (time budget") for v in report["variants"].values())
    assert len(report["variants"]) == 6 and report["profile"]["status"].startswith("skipped (time budget")
