"""GRPO step time: TRL 1.16's colocate mode against ours, on one CUDA machine (issue 8).

    python3 bench/grpo_step.py --out DIR [--contenders trl-sleep,trl-nosleep,ours-auto,...]
                               [--warmup-steps N --measured-steps M] [--budget-seconds S]

Each contender runs in its own `accelerate launch` (DeepSpeed ZeRO-3) process with the same
model, data, batch, lengths and seeds (fixed below, before any run): warm-up steps, then the
median seconds per step over the measured steps, the device memory peak (NVML, whole GPU:
vLLM's memory is outside torch's allocator), and where our time goes (generate / push /
sleep / wake / offload, from ColocatedVLLM's counters). The parent also measures HBM
bandwidth and bf16 matmul FLOP/s on the machine and reports the floor
    decode bytes ÷ bandwidth + 6 · params · tokens ÷ FLOP/s.
Writes DIR/bench.json and DIR/bench.md (rewritten after every contender, so a run cut short
still reports what finished). Contenders run in the given order until `--budget-seconds`
would be exceeded; the rest are reported as skipped. Each contender is killed after
`--contender-timeout` seconds.

Contenders: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload].
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

# Fixed before the first run (issue 8: no tuning to the numbers).
CONFIG = {
    "prompts_per_step": 16,
    "num_generations": 8,
    "max_completion_length": 64,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 2,  # two optimizer steps per generation: the no-push-due cycle exists
    "learning_rate": 1e-6,
    "warmup_steps": 3,
    "measured_steps": 6,
    "gpu_memory_utilization": 0.3,
    "max_model_len": 512,
    "seed": 42,
}
# Most important first: a run cut by the time budget keeps the headline comparison.
DEFAULT_CONTENDERS = "trl-sleep,ours-auto,trl-nosleep,ours-auto-offload,ours-off,ours-level2"
CONTENDERS = ("trl-sleep", "trl-nosleep", "ours-off", "ours-level1", "ours-level2", "ours-auto")


def check_contender(name: str) -> str:
    base = name.removesuffix("-offload")
    if base not in CONTENDERS or (name.endswith("-offload") and not base.startswith("ours-")):
        raise argparse.ArgumentTypeError(
            f"unknown contender {name!r}: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload]"
        )
    return name


def grpo_args(contender: str, out: Path, steps: int, cpu: bool = False):
    """The GRPOConfig of one contender (identical for all but the sleep switch)."""
    from trl import GRPOConfig

    batch = CONFIG["prompts_per_step"] * CONFIG["num_generations"]
    return GRPOConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=batch,
        num_generations=CONFIG["num_generations"],
        max_completion_length=CONFIG["max_completion_length"],
        gradient_accumulation_steps=CONFIG["gradient_accumulation_steps"],
        steps_per_generation=CONFIG["steps_per_generation"],
        learning_rate=CONFIG["learning_rate"],
        max_steps=steps,
        beta=0.0,
        bf16=not cpu,
        seed=CONFIG["seed"],
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=CONFIG["gpu_memory_utilization"],
        vllm_max_model_length=CONFIG["max_model_len"],
        vllm_enable_sleep_mode=contender == "trl-sleep",
        model_init_kwargs={"dtype": "float32" if cpu else "bfloat16"},
    )


# ---------------------------------------------------------------- worker (one contender)
def worker(contender: str, out: Path, warmup: int, measured: int, cpu: bool = False) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Explain."}]} for a in range(1, 30) for b in range(1, 30)]
    args = grpo_args(contender, out, warmup + measured, cpu)
    cuda = torch.cuda.is_available() and not cpu

    def reward(completions, **kwargs):
        return [float(len(c[-1]["content"]) % 7) for c in completions]

    kwargs = dict(model=MODEL, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows))
    if contender.startswith("trl-"):
        trainer = GRPOTrainer(**kwargs)
    else:
        from colocgrpo_training.config import VLLMSettings
        from colocgrpo_training.generation import ColocGRPOTrainer

        policy = contender.removeprefix("ours-").removesuffix("-offload")
        settings = VLLMSettings(
            sleep_policy=policy,
            gpu_memory_utilization=CONFIG["gpu_memory_utilization"],
            max_model_len=CONFIG["max_model_len"],
            offload_trainer_state=contender.endswith("-offload"),
        )
        trainer = ColocGRPOTrainer(**kwargs, generation_settings=settings)

    times: list[float] = []
    peaks: list[int] = []
    log_entries: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)
            if cuda:
                free, total = torch.cuda.mem_get_info()
                peaks.append(total - free)

        def on_log(self, a, state, control, logs=None, **k):
            if logs:
                log_entries.append({key: v for key, v in logs.items() if isinstance(v, (int, float))})

    trainer.add_callback(Timer())
    trainer.train()
    measured_times = times[warmup:] or times
    last = log_entries[-1] if log_entries else {}
    breakdown = {}
    if hasattr(trainer, "generation_metrics"):
        breakdown = trainer.generation_metrics()
    result = {
        "contender": contender,
        "median_s_per_step": statistics.median(measured_times),
        "warmup_steps": warmup,
        "measured_steps": len(times) - warmup,
        "step_times": times,
        "peak_device_bytes_at_step_end": max(peaks) if peaks else 0,
        "breakdown_total_seconds": breakdown,
        "profiling": {k: v for k, v in last.items() if k.startswith("profiling/")},
        "logp_diff": last.get("sampling/sampling_logp_difference/mean"),
        "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in trainer.model.parameters()),
    }
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "result.json").write_text(json.dumps(result, indent=2))


# ---------------------------------------------------------------- machine floor
def measure_machine() -> dict:
    import torch

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bandwidth = 2 * x.numel() * 10 / (time.perf_counter() - t0)  # read + write
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 20 / (time.perf_counter() - t0)
    return {"hbm_bytes_per_s": bandwidth, "bf16_flop_per_s": flops, "device": torch.cuda.get_device_name()}


def floor_seconds(machine: dict, params: int) -> dict:
    batch = CONFIG["prompts_per_step"] * CONFIG["num_generations"]
    prompt_tokens = 40  # chat-formatted "What is a + b? Explain." for SmolLM2's template
    tokens = batch * (prompt_tokens + CONFIG["max_completion_length"])
    # One generation serves steps_per_generation optimizer steps.
    decode_bytes = params * 2 * CONFIG["max_completion_length"] / CONFIG["steps_per_generation"]
    decode = decode_bytes / machine["hbm_bytes_per_s"]
    train = 6 * params * tokens / machine["bf16_flop_per_s"]
    return {"decode_s": decode, "train_s": train, "floor_s_per_step": decode + train}


# ---------------------------------------------------------------- parent
ACTIVE_CHILD: list[subprocess.Popen] = []


def stop_children(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT (e.g. from `timeout`): take the child's process group down too — it
    runs in its own session and would otherwise outlive us, holding the GPU."""
    for proc in ACTIVE_CHILD:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def run_child(cmd: list[str], env: dict, work: Path, timeout_s: float) -> tuple[int, bool]:
    """Run one child in its own process group; on timeout the launcher and workers all go."""
    with open(work / "stdout.log", "w") as out, open(work / "stderr.log", "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, start_new_session=True)
        ACTIVE_CHILD[:] = [proc]
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, True


def write_report(out: Path, machine: dict, results: list[dict], warmup: int, measured: int) -> list[str]:
    params = next((r["params"] for r in results if "params" in r), 0)
    floor = floor_seconds(machine, params) if machine.get("hbm_bytes_per_s") and params else {}
    config = {**CONFIG, "warmup_steps": warmup, "measured_steps": measured}
    summary = {"config": config, "machine": machine, "floor": floor, "results": results}
    (out / "bench.json").write_text(json.dumps(summary, indent=2))
    lines = [
        "| contender | median s/step | peak device GiB | push s | sleep s | wake s | generate s | offload s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "median_s_per_step" not in r:
            lines.append(f"| {r['contender']} | {r.get('status', 'failed')} | | | | | | |")
            continue
        b = r["breakdown_total_seconds"]
        lines.append(
            f"| {r['contender']} | {r['median_s_per_step']:.3f} | {r['peak_device_bytes_at_step_end'] / 2**30:.1f} | "
            + " | ".join(f"{b.get('generation/' + k, float('nan')):.3f}" for k in ("push_seconds", "sleep_seconds", "wake_seconds", "generate_seconds", "offload_seconds"))
            + " |"
        )  # fmt: skip
    if floor:
        lines.append(f"\nfloor: {floor['floor_s_per_step']:.4f} s/step on {machine['device']} "
                     f"({machine['hbm_bytes_per_s'] / 1e12:.2f} TB/s, {machine['bf16_flop_per_s'] / 1e12:.0f} TFLOP/s bf16)")  # fmt: skip
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--contenders",
        default=DEFAULT_CONTENDERS,
        type=lambda v: [check_contender(c) for c in v.split(",") if c],
    )
    parser.add_argument("--warmup-steps", type=int, default=CONFIG["warmup_steps"])
    parser.add_argument("--measured-steps", type=int, default=CONFIG["measured_steps"])
    parser.add_argument("--budget-seconds", type=float, default=480.0, help="start no contender past this")
    parser.add_argument("--contender-timeout", type=float, default=200.0)
    parser.add_argument("--cpu", action="store_true", help="CPU dry run of the plumbing (a vLLM stand-in)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-machine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup_steps < 0 or args.measured_steps < 1:
        parser.error("--warmup-steps must be >= 0 and --measured-steps >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    if args.worker:
        worker(args.worker, out, args.warmup_steps, args.measured_steps, cpu=args.cpu)
        return 0
    if args.measure_machine:
        (out / "machine.json").write_text(json.dumps(measure_machine()))
        return 0
    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    if not Path(MODEL).exists():
        print(f"[bench] model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}",
        VLLM_USE_FLASHINFER_SAMPLER="0",
        PYTHONUNBUFFERED="1",
    )
    # Its own process, so that the parent holds no GPU memory while the contenders run.
    machine: dict = {}
    if not args.cpu:
        code, timed_out = run_child([sys.executable, __file__, "--out", str(out), "--measure-machine"], env, out, 120)
        if code == 0 and (out / "machine.json").exists():
            machine = json.loads((out / "machine.json").read_text())
        else:
            machine = {"error": f"machine measurement failed (rc {code}, timed out {timed_out})"}
    ds = out / "deepspeed.json"
    ds.write_text(json.dumps({
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }))  # fmt: skip
    results: list[dict] = []
    last_wall = 100.0  # a first guess of one contender's wall time, then the last one's
    for contender in args.contenders:
        elapsed = time.perf_counter() - began
        if elapsed + last_wall > args.budget_seconds:
            results.append({"contender": contender, "status": "skipped (time budget)"})
            print(f"[bench] {contender}: skipped, {elapsed:.0f} s used of {args.budget_seconds:.0f}", flush=True)
            continue
        work = out / contender
        work.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--use_deepspeed", "--deepspeed_config_file", str(ds), "--zero3_init_flag", "true",
            "--num_processes", "1", "--mixed_precision", "no" if args.cpu else "bf16",
            str(Path(__file__).resolve()), "--worker", contender, "--out", str(work),
            "--warmup-steps", str(args.warmup_steps), "--measured-steps", str(args.measured_steps),
        ] + (["--cpu"] if args.cpu else [])  # fmt: skip
        start = time.perf_counter()
        timeout = min(args.contender_timeout, max(30.0, args.budget_seconds + 60 - elapsed))
        code, timed_out = run_child(cmd, env, work, timeout)
        wall = time.perf_counter() - start
        last_wall = wall
        if code != 0 or not (work / "result.json").exists():
            tail = (work / "stderr.log").read_text(errors="replace")[-3000:]
            status = f"timed out after {timeout:.0f} s" if timed_out else f"failed (rc {code})"
            results.append({"contender": contender, "status": status, "error": tail, "wall_s": wall})
            print(f"[bench] {contender}: {status.upper()}\n{tail[-1500:]}", flush=True)
        else:
            result = json.loads((work / "result.json").read_text())
            result["wall_s"] = wall
            results.append(result)
            print(f"[bench] {contender}: {result['median_s_per_step']:.3f} s/step ({wall:.0f} s wall)", flush=True)
        write_report(out, machine, results, args.warmup_steps, args.measured_steps)
    lines = write_report(out, machine, results, args.warmup_steps, args.measured_steps)
    print("\n".join(lines))
    return 0 if results and all("median_s_per_step" in r or r.get("status", "").startswith("skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
