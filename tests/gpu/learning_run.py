"""Learning run through the project's entrypoint (issue 7 §2), on a CUDA machine.

`accelerate launch` (DeepSpeed ZeRO-3, one process per GPU) → `python -m colocgrpo_training
--config grpo.yaml` with vLLM colocated, on SmolLM2-135M-Instruct, task "What is a + b?"
(a, b in 1..20, chat template, data generated here) with an exact-answer reward plus the
format reward. Pass: mean reward of the last 10 steps ≥ mean of the first 10 + 0.1, and the
vLLM↔trainer log-prob difference (TRL's sampling/sampling_logp_difference/mean) stays at
or below the sleep-off run's (×1.1 for noise).

    python3 tests/gpu/learning_run.py --out DIR [--steps 100] [--reference-steps 20]

Writes DIR/learning_run.json and DIR/reward_curve.csv; exits 1 when a criterion fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

REWARD_MODULE = textwrap.dedent(
    '''
    import re

    def exact_answer(completions, solution, **kwargs):
        """1.0 when the completion is exactly the number (an optional trailing period allowed)."""
        out = []
        for completion, gold in zip(completions, solution):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            out.append(1.0 if text.strip().rstrip(".").strip() == str(gold).strip() else 0.0)
        return out
    '''
)


def write_inputs(work: Path, policy: str, steps: int, offload: bool) -> Path:
    rng = random.Random(0)
    rows = []
    for _ in range(2000):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append({"problem": f"What is {a} + {b}?", "solution": str(a + b)})
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "rewards").mkdir(exist_ok=True)
    (work / "rewards" / "arith_reward.py").write_text(REWARD_MODULE)
    config = {
        "version": 1,
        "job": {"name": f"learn-{policy}", "namespace": "default"},
        "model": {"name_or_path": MODEL, "dtype": "bfloat16"},
        "dataset": {
            "name_or_path": str(work / "data.jsonl"),
            "system_prompt": "Answer with only the number.",
        },
        "rewards": [
            {"function": "arith_reward:exact_answer", "weight": 1.0},
            {"function": "format", "weight": 0.5},
        ],
        "reward_modules_dir": str(work / "rewards"),
        "vllm": {
            "enabled": True,
            "sleep_policy": policy,
            "gpu_memory_utilization": 0.3,
            "max_model_len": 512,
            "offload_trainer_state": offload,
        },
        # One checkpoint at the end: its trainer_state.json holds every logged value.
        "checkpoint": {"dir": str(work / "ckpt"), "save_steps": steps, "save_final_model": False},
        "progress": {"min_interval_seconds": 0, "patch_status": False},
        "grpo": {
            "max_steps": steps,
            "per_device_train_batch_size": 64,
            "num_generations": 8,
            "max_completion_length": 24,
            "learning_rate": 1e-5,
            "beta": 0.0,
            "seed": 42,
            "disable_tqdm": True,
        },
    }
    import yaml

    path = work / "grpo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    (work / "deepspeed.json").write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 3, "overlap_comm": True, "stage3_gather_16bit_weights_on_model_save": True},
                "bf16": {"enabled": True},
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
            }
        )
    )
    (work / "accelerate.yaml").write_text(
        yaml.safe_dump(
            {
                "compute_environment": "LOCAL_MACHINE",
                "distributed_type": "DEEPSPEED",
                "deepspeed_config": {"deepspeed_config_file": str(work / "deepspeed.json"), "zero3_init_flag": True},
                "num_processes": int(os.environ.get("COLOCGRPO_NUM_GPUS", "1")),
                "num_machines": 1,
                "machine_rank": 0,
                "mixed_precision": "bf16",
                "main_training_function": "main",
            }
        )
    )
    return path


def run(work: Path, policy: str, steps: int, offload: bool = False) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    config = write_inputs(work, policy, steps, offload)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(work / "accelerate.yaml"),
        "-m", "colocgrpo_training", "--config", str(config),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (work / "stdout.log").write_text(proc.stdout)
    (work / "stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{policy} run failed ({proc.returncode}); tail:\n{proc.stderr[-4000:]}")
    state_files = sorted((work / "ckpt").glob("checkpoint-*/trainer_state.json"))
    if not state_files:
        raise SystemExit(f"{policy} run wrote no trainer_state.json under {work / 'ckpt'}")
    history = json.loads(state_files[-1].read_text())["log_history"]
    steps_log = [h for h in history if "reward" in h and "step" in h]
    return {
        "policy": policy,
        "seconds": seconds,
        "rewards": [h["reward"] for h in steps_log],
        "logp_diff": [h.get("sampling/sampling_logp_difference/mean") for h in steps_log],
        "step_time": [h.get("step_time") for h in steps_log],
        "generation": {k: v for k, v in steps_log[-1].items() if k.startswith("generation/")} if steps_log else {},
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reference-steps", type=int, default=20)
    parser.add_argument("--policy", default="auto")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    main_run = run(args.out / f"run-{args.policy}", args.policy, args.steps)
    reference = run(args.out / "run-off", "off", args.reference_steps)

    rewards = main_run["rewards"]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])

    def mean_diff(r: dict) -> float:
        values = [v for v in r["logp_diff"] if v is not None]
        return statistics.mean(values) if values else float("nan")

    diff_main, diff_off = mean_diff(main_run), mean_diff(reference)
    verdict = {
        "first10_reward": first,
        "last10_reward": last,
        "reward_gain": last - first,
        "reward_pass": last >= first + 0.1,
        "logp_diff_mean": diff_main,
        "logp_diff_mean_sleep_off": diff_off,
        "logp_pass": diff_main <= diff_off * 1.1,
    }
    (args.out / "learning_run.json").write_text(json.dumps({"verdict": verdict, "runs": [main_run, reference]}, indent=2))
    (args.out / "reward_curve.csv").write_text(
        "step,reward,logp_diff\n"
        + "".join(f"{i + 1},{r},{d}\n" for i, (r, d) in enumerate(zip(rewards, main_run["logp_diff"])))
    )
    print(json.dumps(verdict, indent=2))
    return 0 if verdict["reward_pass"] and verdict["logp_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
