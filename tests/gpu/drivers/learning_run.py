"""Learning run through the project's entrypoint, on a CUDA machine.

`python -m accelerate.commands.launch` (DeepSpeed ZeRO-3, one process per GPU) →
`-m colocgrpo_training --config grpo.yaml` with vLLM colocated, on SmolLM2-135M-Instruct,
task "What is a + b?" (a, b in 1..20, chat template, data generated here) with an
exact-answer reward — the setup in which TRL 1.16's own GRPOTrainer was measured to learn
on an H200 (reward 0.01 → 0.21 in 80 steps). deepspeed.json and
accelerate.yaml are the operator's own renderings (examples/seed-qwen14b-tp4.yaml) with
the topology set to this machine.

Pass: mean reward of the last 10 steps ≥ mean of the first 10 + 0.1 (not with `--logp-only`),
and the vLLM↔trainer log-prob difference (TRL's sampling/sampling_logp_difference/mean) over
the first `--reference-steps` steps stays within (1 + `--logp-rel-tol`)× the sleep-off
reference run's over the same steps, plus `--logp-abs-tol` (default 1.2× + 0.005; same seed,
same data order, the main run's deepspeed.json). `--smoke`: plumbing only (no criteria, no
reference). `--offload-trainer-state` offloads the trainer state in the main run;
`--render-gpus N` trains under the deepspeed.json of an N-GPU job; `--force-gather` makes
every weight push go through ZeRO-3's GatheredParameters (COLOCGRPO_PUSH_FORCE_GATHER=1).
`--num-processes N --tp T` runs the job of one node with N GPUs and vLLM TP T (the step's
`--batch` completions shared over the N processes); `--cpu` is a dry run of the plumbing on CPU
with a vLLM stand-in on PYTHONPATH (float32, DeepSpeed over gloo).

    python3 tests/gpu/drivers/learning_run.py --out DIR [--steps 80] [--reference-steps 12] [--smoke]
        [--policy auto] [--offload-trainer-state] [--render-gpus N] [--force-gather]
        [--logp-only] [--logp-rel-tol 0.2] [--logp-abs-tol 0.005] [--num-processes 1 --tp 1] [--cpu]

Writes DIR/learning_run.json and DIR/reward_curve.csv; exits 1 when a criterion fails,
2 when a run fails or exceeds its time limit (its logs stay under DIR/run-*/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.child_process import install_stop_handlers, run_child
from bench.machine_job import EXAMPLE, folder_shape, machine_job
from colocgrpo_training.config import CONFIG_VERSION

# colocgrpo_training.generation.vllm_engine.FORCE_GATHER_ENV (not imported: that pulls in torch and TRL)
FORCE_GATHER_ENV = "COLOCGRPO_PUSH_FORCE_GATHER"

REPO = Path(__file__).resolve().parents[3]

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

REWARD_MODULE = textwrap.dedent(
    '''
    import re

    _NUMBER = re.compile(r"-?\\d+")


    def exact_answer(completions, solution, **kwargs):
        """1.0 when the last number in the completion is exactly the sum.

        The first GPU run scored the whole text against the number ("5" only): SmolLM2 answers in a
        sentence ("3 + 2 = 5."), so every completion scored 0 and GRPO had no signal at all.
        """
        out = []
        for completion, gold in zip(completions, solution):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            numbers = _NUMBER.findall(text)
            out.append(1.0 if numbers and numbers[-1] == str(gold).strip() else 0.0)
        return out
    '''
)

# The fallback when the operator's renderer cannot be imported here (recorded in the result).
FALLBACK_DEEPSPEED = {
    "zero_optimization": {"stage": 3, "overlap_comm": True, "stage3_gather_16bit_weights_on_model_save": True},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
}


def launch_files(
    work: Path,
    num_processes: int,
    offload_trainer_state: bool = False,
    render_gpus: int | None = None,
    tensor_parallel_size: int = 1,
) -> tuple[dict, dict, str]:
    """deepspeed.json and accelerate.yaml as the operator renders them for a GPU job with the
    topology of this one machine and the run's trainer-state offload (bench/machine_job.py):
    a one-GPU run gets the ZeRO-3 file a one-GPU job gets. `render_gpus` renders deepspeed.json
    for a job of that many GPUs instead (run on this machine's `num_processes`): one GPU then
    takes the multi-GPU ZeRO-3 layout. accelerate refuses a config that sets mixed_precision
    next to a deepspeed_config_file, and so does the rendering: precision lives in GRPOConfig."""
    try:
        from colocgrpo_operator.render import accelerate_config, deepspeed_config

        job = machine_job(
            gpus=num_processes, offload_trainer_state=offload_trainer_state, tensor_parallel_size=tensor_parallel_size
        )
        shape = folder_shape(MODEL)  # the ZeRO-3 knobs sized for the model trained
        ds, acc = deepspeed_config(job, shape=shape), accelerate_config(job)
        source = f"operator render of {EXAMPLE.name} on 1 node x {num_processes} GPUs, TP {tensor_parallel_size}"
        if render_gpus is not None and render_gpus != num_processes:
            ds = deepspeed_config(
                machine_job(gpus=render_gpus, offload_trainer_state=offload_trainer_state), shape=shape
            )
            source += f" (deepspeed.json rendered for 1 node x {render_gpus} GPUs)"
    except Exception as err:
        ds = FALLBACK_DEEPSPEED
        acc = {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "DEEPSPEED",
            "main_training_function": "main",
        }
        source = f"fallback (operator render failed: {err!r})"
    acc = dict(acc)
    acc.update(
        num_machines=1,
        num_processes=num_processes,
        machine_rank=0,
        main_process_ip="127.0.0.1",
        main_process_port=int(os.environ.get("COLOCGRPO_MASTER_PORT", "29511")),
        deepspeed_config={
            **acc.get("deepspeed_config", {}),
            "deepspeed_config_file": str(work / "deepspeed.json"),
            "deepspeed_multinode_launcher": "standard",
        },
    )
    acc.pop("mixed_precision", None)
    return ds, acc, source


def write_inputs(
    work: Path,
    policy: str,
    steps: int,
    grpo: dict[str, Any],
    offload: bool,
    dtype: str,
    render_gpus: int | None = None,
    deepspeed_from: Path | None = None,
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
) -> tuple[Path, str]:
    import yaml

    rng = random.Random(0)
    rows = []
    for _ in range(2000):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append({"problem": f"What is {a} + {b}?", "solution": str(a + b)})
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "rewards").mkdir(exist_ok=True)
    (work / "rewards" / "arith_reward.py").write_text(REWARD_MODULE)
    config = {
        "version": CONFIG_VERSION,
        "job": {"name": f"learn-{policy}", "namespace": "default"},
        "model": {"name_or_path": MODEL, "dtype": dtype},
        "dataset": {"name_or_path": str(work / "data.jsonl")},
        "rewards": [{"function": "arith_reward:exact_answer", "weight": 1.0}],
        "reward_modules_dir": str(work / "rewards"),
        "resources": {"nodes": 1, "gpus_per_node": num_processes},
        "vllm": {
            "enabled": True,
            "tensor_parallel_size": tensor_parallel_size,
            "sleep_policy": policy,
            "gpu_memory_utilization": 0.3,
            "max_model_len": 512,
            "offload_trainer_state": offload,
        },
        # One checkpoint at the end: its trainer_state.json holds every logged value
        # (the progress lines on stdout are the fallback when a run dies first).
        "checkpoint": {"dir": str(work / "ckpt"), "save_steps": steps, "save_final_model": False, "resume": "never"},
        "progress": {"min_interval_seconds": 0, "patch_status": False},
        "grpo": {"max_steps": steps, **grpo},
    }
    path = work / "grpo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    ds, acc, source = launch_files(
        work,
        num_processes,
        offload_trainer_state=offload,
        render_gpus=render_gpus,
        tensor_parallel_size=tensor_parallel_size,
    )
    if deepspeed_from is not None:
        # The reference trains under the main run's file (its optimizer too): only sleep and offload differ.
        ds = json.loads(deepspeed_from.read_text())
        source += f"; deepspeed.json copied from {deepspeed_from.parent.name}"
    (work / "deepspeed.json").write_text(json.dumps(ds, indent=2))
    (work / "accelerate.yaml").write_text(yaml.safe_dump(acc, sort_keys=False))
    return path, source


def history_from_progress_lines(stdout: str) -> list[dict]:
    """Per-step metrics from the trainer's progress lines (one JSON object per report)."""
    by_step: dict[int, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith('{"progress"'):
            continue
        try:
            progress = json.loads(line)["progress"]
        except (ValueError, KeyError):
            continue
        metrics = progress.get("metrics") or {}
        if "reward" in metrics and progress.get("step"):
            by_step[int(progress["step"])] = {"step": int(progress["step"]), **metrics}
    return [by_step[s] for s in sorted(by_step)]


def run(
    work: Path,
    policy: str,
    steps: int,
    grpo: dict[str, Any],
    timeout_s: float,
    offload: bool = False,
    dtype: str = "bfloat16",
    render_gpus: int | None = None,
    deepspeed_from: Path | None = None,
    extra_env: dict[str, str] | None = None,
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    config, launch_source = write_inputs(
        work, policy, steps, grpo, offload, dtype, render_gpus, deepspeed_from, num_processes, tensor_parallel_size
    )
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(work / "accelerate.yaml"),
        "-m",
        "colocgrpo_training",
        "--config",
        str(config),
    ]
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}",
        COLOCGRPO_TERMINATION_LOG=str(work / "termination-log"),
        VLLM_USE_FLASHINFER_SAMPLER="0",
        PYTHONUNBUFFERED="1",
        **(extra_env or {}),
    )
    print(
        f"[learning] {policy}{' + offload' if offload else ''}: {steps} steps, limit {timeout_s:.0f} s "
        f"({launch_source}{'; env ' + str(extra_env) if extra_env else ''})",
        flush=True,
    )
    start = time.perf_counter()
    # Own process group: on timeout the launcher and its workers all go.
    returncode, timed_out = run_child(cmd, env, work, timeout_s, cwd=work)
    seconds = time.perf_counter() - start
    stdout = (work / "stdout.log").read_text(errors="replace")
    stderr = (work / "stderr.log").read_text(errors="replace")
    state_files = sorted((work / "ckpt").glob("checkpoint-*/trainer_state.json"))
    if state_files:
        history = [h for h in json.loads(state_files[-1].read_text())["log_history"] if "reward" in h and "step" in h]
        source = str(state_files[-1].relative_to(work))
    else:
        history, source = history_from_progress_lines(stdout), "progress lines"
    termination = work / "termination-log"
    result = {
        "policy": policy,
        "offload_trainer_state": offload,
        "extra_env": extra_env or {},
        "steps": steps,
        "seconds": seconds,
        "returncode": returncode,
        "timed_out": timed_out,
        "launch_files": launch_source,
        "history_source": source,
        "termination_message": termination.read_text()[:2000] if termination.exists() else None,
        "rewards": [h["reward"] for h in history],
        "logp_diff": [h.get("sampling/sampling_logp_difference/mean") for h in history],
        "step_time": [h.get("step_time") for h in history],
        "generation": {k: v for k, v in history[-1].items() if k.startswith("generation/")} if history else {},
    }
    print(
        f"[learning] {policy}: rc {returncode}{' (TIMED OUT)' if timed_out else ''}, {seconds:.0f} s, "
        f"{len(history)} logged steps",
        flush=True,
    )
    if returncode != 0:
        result["stderr_tail"] = stderr[-4000:]
        print(stderr[-3000:], file=sys.stderr, flush=True)
    return result


def mean(values: list) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.mean(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--reference-steps", type=int, default=12)
    parser.add_argument("--policy", default="auto")
    parser.add_argument("--smoke", action="store_true", help="plumbing only: no criteria, no reference run")
    parser.add_argument(
        "--batch", type=int, default=64, help="completions per step (prompts × generations), over all processes"
    )
    parser.add_argument(
        "--num-processes",
        type=int,
        default=int(os.environ.get("COLOCGRPO_NUM_GPUS", "1")),
        help="training processes, one per GPU (the job's gpusPerNode)",
    )
    parser.add_argument("--tp", type=int, default=1, help="vLLM tensor-parallel size (must divide --num-processes)")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="CPU dry run of the plumbing (a vLLM stand-in on PYTHONPATH): float32, DeepSpeed over gloo",
    )
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--seconds-per-step", type=float, default=2.5, help="for the time limits")
    parser.add_argument("--startup-seconds", type=float, default=180.0, help="for the time limits")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--grpo-extra", type=json.loads, default={}, help="JSON merged into the grpo section")
    parser.add_argument("--offload-trainer-state", action="store_true", help="vllm.offloadTrainerState in the main run")
    parser.add_argument(
        "--render-gpus", type=int, default=None, help="render deepspeed.json for a job of this many GPUs"
    )
    parser.add_argument(
        "--force-gather",
        action="store_true",
        help="COLOCGRPO_PUSH_FORCE_GATHER=1 in both runs: every push through ZeRO-3's GatheredParameters",
    )
    parser.add_argument(
        "--logp-only", action="store_true", help="judge only the log-prob difference (runs too short to learn)"
    )
    # Pass: main ≤ (1 + rel) × reference + abs, over the first --reference-steps steps.
    parser.add_argument("--logp-rel-tol", type=float, default=0.2)
    parser.add_argument("--logp-abs-tol", type=float, default=0.005)
    args = parser.parse_args()
    install_stop_handlers()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not Path(MODEL).exists():
        print(f"[learning] model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)", file=sys.stderr)
        return 2
    if args.batch % args.num_processes or args.num_processes % args.tp:
        parser.error(f"--batch {args.batch} must split over --num-processes {args.num_processes}, which --tp divides")
    grpo = {
        # The step's completions are the same whatever the process count: each process takes its share.
        "per_device_train_batch_size": args.batch // args.num_processes,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "learning_rate": 1e-5,
        "beta": 0.0,
        "seed": 42,
        "disable_tqdm": True,
        # accelerate hands DeepSpeed no backend on a machine without CUDA (and then counts one process).
        **({"ddp_backend": "gloo"} if args.cpu else {}),
        **args.grpo_extra,
    }
    if args.cpu:
        args.dtype = "float32"
    shape = {"num_processes": args.num_processes, "tensor_parallel_size": args.tp}

    def limit(steps: int) -> float:
        return args.startup_seconds + args.seconds_per_step * steps

    extra_env = {FORCE_GATHER_ENV: "1"} if args.force_gather else None
    main_work = out / f"run-{args.policy}{'-offload' if args.offload_trainer_state else ''}"
    runs = [
        run(
            main_work,
            args.policy,
            args.steps,
            grpo,
            limit(args.steps),
            offload=args.offload_trainer_state,
            dtype=args.dtype,
            render_gpus=args.render_gpus,
            extra_env=extra_env,
            **shape,
        )
    ]
    if not args.smoke and runs[0]["returncode"] == 0:
        ref_limit = limit(args.reference_steps)
        runs.append(
            run(
                out / "run-off",
                "off",
                args.reference_steps,
                grpo,
                ref_limit,
                dtype=args.dtype,
                render_gpus=args.render_gpus,
                deepspeed_from=main_work / "deepspeed.json",
                extra_env=extra_env,
                **shape,
            )
        )
    main_run = runs[0]
    rewards = main_run["rewards"]
    n = args.reference_steps
    verdict: dict[str, Any] = {
        **shape,
        "smoke": args.smoke,
        "runs_ok": all(r["returncode"] == 0 for r in runs),
        "logged_steps": len(rewards),
        "first10_reward": mean(rewards[:10]),
        "last10_reward": mean(rewards[-10:]),
        "logp_diff_mean_all": mean(main_run["logp_diff"]),
    }
    verdict["reward_gain"] = verdict["last10_reward"] - verdict["first10_reward"]
    if not args.smoke and len(runs) == 2:
        verdict["logp_diff_mean_first_n"] = mean(main_run["logp_diff"][:n])
        verdict["logp_diff_mean_sleep_off_first_n"] = mean(runs[1]["logp_diff"][:n])
        verdict["reward_pass"] = True if args.logp_only else verdict["reward_gain"] >= 0.1
        # Default 1.2× plus 0.005 absolute: run-to-run noise (both measured ≈ 0.04 on this machine).
        reference = verdict["logp_diff_mean_sleep_off_first_n"]
        bound = (1 + args.logp_rel_tol) * reference + args.logp_abs_tol
        verdict["logp_bound"] = bound
        verdict["logp_ratio_to_sleep_off"] = verdict["logp_diff_mean_first_n"] / reference if reference else None
        verdict["logp_pass"] = verdict["logp_diff_mean_first_n"] <= bound
    (out / "learning_run.json").write_text(json.dumps({"verdict": verdict, "runs": runs}, indent=2))
    (out / "reward_curve.csv").write_text(
        "step,reward,logp_diff\n"
        + "".join(f"{i + 1},{r},{d}\n" for i, (r, d) in enumerate(zip(rewards, main_run["logp_diff"], strict=False)))
    )
    print(json.dumps(verdict, indent=2), flush=True)
    if not verdict["runs_ok"] or not rewards:
        return 2
    if args.smoke:
        return 0
    return 0 if verdict.get("reward_pass") and verdict.get("logp_pass") else 1


if __name__ == "__main__":
    sys.exit(main())
