"""The multi-GPU proof command as a dry run on CPU: world size 4 with vLLM TP 2 (DP 2 × TP 2).

`tests/gpu/drivers/run_on_device.sh` runs the GPU suites (weight integrity, the learning run
through the entrypoint, the step benchmark) with `NPROC` processes and vLLM TP size `TP`. Here
the command documented for 4 GPUs runs with `CPU=1`: the vLLM stand-in, the tiny model, DeepSpeed
over gloo. What differs on the GPU machine is the hardware, not the command.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from support.local_pod import ProcessTree

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "gpu" / "drivers" / "run_on_device.sh"
LIMIT_S = 600  # the script's own deadline (DEADLINE_S) is below; past this it hangs


def dry_run_env(trainer_env, tmp_path: Path, model: Path, **settings: str) -> dict[str, str]:
    """The script's environment for a CPU dry run: results in `tmp_path/out`, work files in `tmp_path/work`."""
    import sys

    env = trainer_env(tmp_path)
    env.update(
        CPU="1",
        PYTHON=sys.executable,
        OUT=str(tmp_path / "out"),
        WORK=str(tmp_path / "work"),
        COLOCGRPO_TEST_MODEL=str(model),
        **settings,
    )
    return env


def run_script(env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """run_on_device.sh to its end (exit status, console), or killed at LIMIT_S with every rank it started (torch's
    launcher starts each in a process session of its own), which fails the test."""
    with open(tmp_path / "console.log", "w") as log:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        tree = ProcessTree(proc)
        deadline = time.monotonic() + LIMIT_S
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                tree.refresh()
                time.sleep(0.5)
        finally:
            timed_out = proc.poll() is None
            tree.kill()
    console = (tmp_path / "console.log").read_text(errors="replace")
    if timed_out:
        pytest.fail(f"run_on_device.sh did not finish within {LIMIT_S} s\n{console[-4000:]}")
    return proc.returncode, console


def test_the_four_gpu_command_runs_on_cpu_at_dp2_tp2(tmp_path, tiny_model_dir, trainer_env):
    out, work = tmp_path / "out", tmp_path / "work"
    env = dry_run_env(trainer_env, tmp_path, tiny_model_dir, SMOKE="1", NPROC="4", TP="2", DEADLINE_S="540")
    returncode, _ = run_script(env, tmp_path)
    summary = (out / "summary.txt").read_text()
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert returncode == 0, f"{summary}\n{logs}"
    for part in ("integrity", "learning", "bench"):
        assert re.search(rf"^{part}: rc=0 ", summary, re.M), summary

    # Integrity: every one of the 4 ranks ran the suite (auto over one schedule, the naive level-2 wake), each
    # rank's output whole in a file of its own, in rank order.
    integrity = (out / "integrity-ranks.log").read_text()
    assert re.findall(r"^--- rank (\d+)", integrity, re.M) == ["0", "1", "2", "3"], integrity[-3000:]
    for rank_log in re.split(r"^--- rank \d+\n", integrity, flags=re.M)[1:]:
        assert re.search(r"^=+ 2 passed", rank_log, re.M), rank_log[-3000:]
    checked = json.loads((work / "integrity" / "weight_integrity.json").read_text())
    assert (checked["processes"], checked["tensor_parallel_size"]) == (4, 2)
    assert checked["policies"]["auto"]["runs"][0]["fresh_margins"]

    # Learning: the entrypoint under the operator's 4-GPU, TP-2 render, every step logged.
    learning = json.loads((work / "learning" / "learning_run.json").read_text())
    assert learning["verdict"]["runs_ok"] and learning["verdict"]["logged_steps"] == 3, learning["verdict"]
    assert (learning["verdict"]["num_processes"], learning["verdict"]["tensor_parallel_size"]) == (4, 2)
    assert "1 node x 4 GPUs, TP 2" in learning["runs"][0]["launch_files"]

    # Bench: one contender, 4 processes, TP 2.
    bench = json.loads((work / "bench" / "bench.json").read_text())
    assert (bench["num_processes"], bench["tensor_parallel_size"]) == (4, 2)
    (result,) = bench["results"]
    assert result["contender"] == "ours-auto" and result["median_s_per_step"] > 0, result
    assert (result["num_processes"], result["tensor_parallel_size"]) == (4, 2)


def test_a_seed_size_pair_against_trls_best_runs_on_cpu(tmp_path, tiny_model_dir, trainer_env):
    """`PARTS=pair SIZE=seed PAIR=ours-auto,trl-best`, the command for one seed-shaped pair on an H200, as a CPU
    dry run: the seed size in miniature (a Qwen2 model the bench makes, prompts of exactly 48 tokens, completions
    that never stop early), ours and TRL's trainer with the same micro-batch plan, and the table's TRL best."""
    from bench import pair_table

    out = tmp_path / "out"
    env = dry_run_env(
        trainer_env,
        tmp_path,
        tiny_model_dir,
        PARTS="pair",
        SIZE="seed",
        PAIR="ours-auto,trl-best",
        PAIR_INDEX="1",
        DEADLINE_S="400",
    )
    returncode, console = run_script(env, tmp_path)
    summary = (out / "summary.txt").read_text()
    assert returncode == 0, f"{summary}\n{console[-3000:]}\n{(out / 'pair.log').read_text()[-3000:]}"
    assert re.search(r"^pair: rc=0 ", summary, re.M), summary

    run = json.loads((out / "pair-1.json").read_text())
    assert run["size"] == "seed-cpu" and run["contenders_in_run_order"] == ["trl-best", "ours-auto"]
    assert (run["model"]["kind"], run["model"]["architecture"]) == ("seed", "Qwen2ForCausalLM")
    results = {r["contender"]: r for r in run["results"]}
    for contender, result in results.items():
        assert result["median_s_per_step"] > 0, contender
        assert result["prompt_tokens_range"] == [48, 48], contender
        assert result["completion_tokens_range"] == [8, 8], contender  # every completion full length
        assert result["sequences_per_generate"] == 8, contender
    # trl-best ran TRL's trainer with sleep on, under the operator's file, through the same merge decision as ours.
    assert results["trl-best"]["deepspeed"] == "product"
    assert results["trl-best"]["micro_batch_merge"] == results["ours-auto"]["micro_batch_merge"]
    assert results["trl-best"]["micro_batch"] == results["ours-auto"]["micro_batch"]
    assert "| trl-best | 4 x 2 |" in summary

    rows, left_out = pair_table.pair_rows([("pair-1.json", run)])
    (row,) = rows
    assert not left_out and row["trl_best"] and row["size"] == "seed-cpu"


def test_the_generate_profile_part_times_every_variant_on_cpu_and_returns_its_files(
    tmp_path, tiny_model_dir, trainer_env
):
    """`PARTS=gen-profile` as a CPU dry run: bench.generate_profile with the stand-in and the tiny model, every variant
    timed against the floor, the profiler's op tables, its table in the summary, and its report and op tables among the
    few files the machine returns. No timing is checked beyond being positive (a CPU dry run measures nothing)."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = dry_run_env(trainer_env, tmp_path, tiny_model_dir, PARTS="gen-profile", GEN_PROFILE_REPS="2")
    returncode, console = run_script(env, tmp_path)
    summary = (out / "summary.txt").read_text()
    assert returncode == 0, f"{summary}\n{console[-3000:]}\n{(out / 'gen-profile.log').read_text()[-3000:]}"
    assert re.search(r"^gen-profile: rc=0 ", summary, re.M), summary
    md = (work / "gen-profile" / "generate_profile.md").read_text()
    assert "CPU DRY RUN" in md and "| trainer | measured | 2 |" in md and "| prefill-only | measured | 2 |" in md
    assert "| after-wake, the next generate |" in md
    assert md.strip() in summary and md.strip() in (work / "gen-profile.full.log").read_text()  # printed too
    assert (out / "generate_profile.json").read_text() == (work / "gen-profile" / "generate_profile.json").read_text()

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
    # The profile: one generate, CPU only here, its op table written and returned.
    profile = report["profile"]
    assert profile["status"] == "measured" and profile["wall_s"] > 0 and "gpu_busy_s" not in profile
    ops = (out / "generate_profile_ops.txt").read_text()
    assert "top 25 ops by self_cpu_time_total" in ops and "aten::" in ops
    assert report["versions"]["vllm"] == "0.26.0" and report["commit"]
