"""`python -m bench.generate_profile --cpu`: the short-generate profile's plumbing end to end on CPU, with the vLLM
stand-in and the tiny model: every variant timed, each against the floor, the profiler's op tables, the report's
files. No timing is checked beyond being positive (a CPU dry run measures nothing)."""

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


def test_the_cpu_dry_run_times_every_variant_against_the_floor(tmp_path, trainer_env, tiny_model_dir):
    out = tmp_path / "profile"
    done = run_profile(profile_env(trainer_env, tmp_path, tiny_model_dir), out, "--reps", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "generate_profile.json").read_text())
    assert report["cpu_dry_run"] and report["size"] == "cpu" and report["model"]["path"] == str(tiny_model_dir)
    assert report["order"] == ["trainer", "no-logprobs", "detokenize", "greedy", "prefill-only", "after-wake"]
    batch = report["batch"]
    assert batch["sequences"] == 32 and batch["completion_tokens"] == 8  # the cpu size: 16 x 2, 8 tokens
    for name in report["order"]:
        variant = report["variants"][name]
        assert variant["status"] == "measured", (name, variant)
        assert len(variant["seconds"]) == variant["reps"] == 2 and all(s > 0 for s in variant["seconds"]), name
        assert variant["ratio_to_floor"] > 0 and variant["step_ratio_to_floor"] > 0, name
        assert variant["token_ids_returned"] and variant["sequences"] == 32, name
        expected = 1 if name == "prefill-only" else 8
        assert variant["tokens"] == 32 * expected and variant["tokens_per_sequence"] == expected, name
    # The sampling is the trainer's (TRL's defaults, logprobs=0, every sequence full length); each variant
    # changes its one thing, and log-probs come back unless asked away.
    trainer = report["variants"]["trainer"]
    assert trainer["sampling"] == report["sampling"]
    assert report["sampling"]["logprobs"] == 0 and report["sampling"]["ignore_eos"] is True
    assert trainer["logprobs_returned"] and not report["variants"]["no-logprobs"]["logprobs_returned"]
    assert report["variants"]["detokenize"]["sampling"]["detokenize"] is True
    assert report["variants"]["trainer"]["sampling"]["detokenize"] is False  # the trainer's own sampling
    assert report["variants"]["greedy"]["sampling"]["temperature"] == 0.0
    wake = report["variants"]["after-wake"]
    assert wake["later"]["reps"] == 2 and wake["sleep_s"]["reps"] == wake["wake_s"]["reps"] == 2
    # The engine is the trainer's: external_launcher, sleep mode, processed log-probs.
    engine = report["engine"]
    assert engine["distributed_executor_backend"] == "external_launcher" and engine["enable_sleep_mode"] is True
    assert engine["logprobs_mode"] == "processed_logprobs" and engine["max_num_seqs"] == 32
    floor = report["floor"]
    assert floor["floor_s"] > 0 and floor["decode_steps"] == 8 and floor["params"] > 0
    assert set(report["differences"]) >= {"logprobs_s", "sampling_s", "decode_s_per_step", "first_after_wake_s"}
    # The profile: one generate, CPU only here, its op table written.
    profile = report["profile"]
    assert profile["status"] == "measured" and profile["wall_s"] > 0 and "gpu_busy_s" not in profile
    ops = (out / "generate_profile_ops.txt").read_text()
    assert "top 25 ops by self_cpu_time_total" in ops and "aten::" in ops
    assert report["versions"]["vllm"] == "0.26.0" and report["commit"]
    md = (out / "generate_profile.md").read_text()
    assert "CPU DRY RUN" in md and "| prefill-only | measured | 2 |" in md
    assert "| after-wake, the next generate |" in md
    assert md.strip() in done.stdout  # the table is printed too


def test_a_budget_already_spent_skips_every_variant_and_says_so(tmp_path, trainer_env, tiny_model_dir):
    out = tmp_path / "profile"
    done = run_profile(profile_env(trainer_env, tmp_path, tiny_model_dir), out, "--budget-seconds", "0")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # nothing measured: not a success
    report = json.loads((out / "generate_profile.json").read_text())
    assert all(v["status"].startswith("skipped (time budget") for v in report["variants"].values())
    assert len(report["variants"]) == 6 and report["profile"]["status"].startswith("skipped (time budget")
