"""GRPO step time: TRL 1.16's colocate mode against ours, on one CUDA machine (issue 8).

    python3 bench/grpo_step.py --out DIR [--contenders trl-sleep,trl-nosleep,ours-auto,...]

Each contender runs in its own `accelerate launch` (DeepSpeed ZeRO-3) process with the same
model, data, batch, lengths and seeds (fixed below, before any run): warm-up steps, then the
median seconds per step over the measured steps, the device memory peak (NVML, whole GPU:
vLLM's memory is outside torch's allocator), and where our time goes (generate / push /
sleep / wake / offload, from ColocatedVLLM's counters). The parent also measures HBM
bandwidth and bf16 matmul FLOP/s on the machine and reports the floor
    decode bytes ÷ bandwidth + 6 · params · tokens ÷ FLOP/s.
Writes DIR/bench.json and DIR/bench.md.

Contenders: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload].
"""

from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_CONTENDERS = "trl-nosleep,trl-sleep,ours-off,ours-level2,ours-auto,ours-auto-offload"


# ---------------------------------------------------------------- worker (one contender)
def worker(contender: str, out: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Explain."}]} for a in range(1, 30) for b in range(1, 30)]
    batch = CONFIG["prompts_per_step"] * CONFIG["num_generations"]
    steps = CONFIG["warmup_steps"] + CONFIG["measured_steps"]
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=batch,
        num_generations=CONFIG["num_generations"],
        max_completion_length=CONFIG["max_completion_length"],
        gradient_accumulation_steps=CONFIG["gradient_accumulation_steps"],
        steps_per_generation=CONFIG["steps_per_generation"],
        learning_rate=CONFIG["learning_rate"],
        max_steps=steps,
        beta=0.0,
        bf16=True,
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
        model_init_kwargs={"dtype": "bfloat16"},
    )

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
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)
            free, total = torch.cuda.mem_get_info()
            peaks.append(total - free)

        def on_log(self, a, state, control, logs=None, **k):
            if logs:
                log_entries.append({key: v for key, v in logs.items() if isinstance(v, (int, float))})

    trainer.add_callback(Timer())
    trainer.train()
    measured = times[CONFIG["warmup_steps"] :]
    last = log_entries[-1] if log_entries else {}
    breakdown = {}
    if hasattr(trainer, "generation_metrics"):
        breakdown = trainer.generation_metrics()
    result = {
        "contender": contender,
        "median_s_per_step": statistics.median(measured),
        "step_times": times,
        "peak_device_bytes_at_step_end": max(peaks),
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
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--contenders", default=DEFAULT_CONTENDERS)
    parser.add_argument("--worker", default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    machine = measure_machine()
    results = []
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}")
    ds = args.out / "deepspeed.json"
    ds.write_text(json.dumps({
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }))  # fmt: skip
    for contender in args.contenders.split(","):
        work = args.out / contender
        work.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--use_deepspeed", "--deepspeed_config_file", str(ds), "--zero3_init_flag", "true",
            "--num_processes", "1", "--mixed_precision", "bf16",
            str(Path(__file__).resolve()), "--worker", contender, "--out", str(work),
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (work / "stdout.log").write_text(proc.stdout)
        (work / "stderr.log").write_text(proc.stderr)
        if proc.returncode != 0 or not (work / "result.json").exists():
            results.append({"contender": contender, "error": proc.stderr[-3000:], "wall_s": time.perf_counter() - start})
            print(f"{contender}: FAILED", flush=True)
            continue
        result = json.loads((work / "result.json").read_text())
        result["wall_s"] = time.perf_counter() - start
        results.append(result)
        print(f"{contender}: {result['median_s_per_step']:.3f} s/step", flush=True)
    params = next((r["params"] for r in results if "params" in r), 0)
    summary = {"config": CONFIG, "machine": machine, "floor": floor_seconds(machine, params), "results": results}
    (args.out / "bench.json").write_text(json.dumps(summary, indent=2))
    lines = [
        "| contender | median s/step | peak device GiB | push s | sleep s | wake s | generate s | offload s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['contender']} | failed | | | | | | |")
            continue
        b = r["breakdown_total_seconds"]
        lines.append(
            f"| {r['contender']} | {r['median_s_per_step']:.3f} | {r['peak_device_bytes_at_step_end'] / 2**30:.1f} | "
            + " | ".join(f"{b.get('generation/' + k, float('nan')):.3f}" for k in ("push_seconds", "sleep_seconds", "wake_seconds", "generate_seconds", "offload_seconds"))
            + " |"
        )
    lines.append(f"\nfloor: {summary['floor']['floor_s_per_step']:.4f} s/step on {machine['device']} "
                 f"({machine['hbm_bytes_per_s'] / 1e12:.2f} TB/s, {machine['bf16_flop_per_s'] / 1e12:.0f} TFLOP/s bf16)")  # fmt: skip
    (args.out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
