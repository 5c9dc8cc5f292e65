"""GRPO step time: TRL 1.16's colocate mode against ours, on one CUDA machine.

    python3 -m bench.grpo_step --out DIR [--contenders trl-sleep,trl-nosleep,ours-auto,...]
                               [--warmup-steps N --measured-steps M] [--budget-seconds S]
                               [--num-processes N --tp T]

`--num-processes N --tp T`: every contender as a job of one node with N GPUs (one process each,
the step's completions shared over them) and vLLM tensor-parallel size T, under the files the
operator renders for that shape (`product`).

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

Contenders: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload], each optionally
@plain, @product or @none (no DeepSpeed). A contender that is not measured (skipped for the time
budget, out of memory at every utilization, failed, timed out) makes the run exit 1.

`--pair A,B[,C...] --pair-index K`: one ours-* contender and one or more TRL configurations, the
list rotated left by K (for a pair: A first for an even K, B first for an odd K); each TRL contender
forms a pair with ours (bench/pair_table.py aggregates a series of such runs). `--generate-only N`: no training, one
generation batch through each contender's engine 1 + N times. bench.json records the host (CPU
model, GPU and driver, commit).

Two sizes (`--size`): `small` is SmolLM2-135M-Instruct; `large` is a random-init decoder of
the same family (Llama architecture, SmolLM2's tokenizer) sized so that ZeRO-3 training
state and vLLM compete for the GPU — about 7B parameters on a 141 GiB H200, 3B on an
80 GiB card (`LARGE_SHAPES`, chosen by device memory) — created on the machine by the
bench itself (`--model-dir`; no checkpoint of that size ships anywhere). At the large size
each contender takes the first `vllm_gpu_memory_utilization` of `--util-ladder` that does
not run out of memory (highest first); the report says which. A third, `cpu`, sizes the step for
CPU dry runs of the plumbing (`--cpu`, a vLLM stand-in): no measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext, suppress
from pathlib import Path

from bench.child_process import install_stop_handlers, run_child
from bench.machine_job import machine_job
from bench.pair_table import working_tree_code

REPO = Path(__file__).resolve().parents[1]

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

# Fixed before the first run (no tuning to the numbers). `small` ran on 2026-12-02
# (commit 09d1197); `large` was fixed on 2026-12-02 before its first run.
SIZES = {
    "small": {
        "prompts_per_step": 16,
        "num_generations": 8,
        "max_completion_length": 64,
        "per_device_train_batch_size": 128,  # the whole step in one micro-batch
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # two optimizer steps per generation: the no-push-due cycle exists
        "learning_rate": 1e-6,
        "warmup_steps": 3,
        "measured_steps": 6,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 512,
        "seed": 42,
    },
    "large": {
        "prompts_per_step": 8,
        "num_generations": 8,
        "max_completion_length": 64,
        "per_device_train_batch_size": 16,  # 64 completions per optimizer step in 4 micro-batches
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 8,  # micro-batches per generation: one generation per two optimizer steps
        "learning_rate": 1e-6,
        "warmup_steps": 2,
        "measured_steps": 6,
        "gpu_memory_utilization": None,  # per contender, from --util-ladder
        "max_model_len": 512,
        "seed": 42,
    },
    # CPU dry runs of the plumbing only (the vLLM stand-in recomputes every token): never a measurement.
    "cpu": {
        "prompts_per_step": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,
        "learning_rate": 1e-6,
        "warmup_steps": 1,
        "measured_steps": 1,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 256,
        "seed": 42,
    },
}
CONFIG = SIZES["small"]
PROMPT_TOKENS = 40  # chat-formatted "What is a + b? Explain." for SmolLM2's template
# Llama-shaped decoders with SmolLM2's vocabulary (49152, tied embeddings). The largest whose
# ZeRO-3 training state (bf16 weights + bf16 grads + fp32 master + two fp32 Adam moments:
# 16 bytes per parameter) fits in 85 % of the card is built, so that vLLM's share is what
# remains: training state and vLLM compete for memory.
LARGE_SHAPES = {
    "7b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
    },
}
TRAINING_STATE_BYTES_PER_PARAM = 16
UTIL_RESERVE_BYTES = 8 * 2**30  # activations, ZeRO-3 buckets, CUDA context, vLLM's graph pool
UTIL_STEP = 0.03
DEFAULT_LARGE_MODEL_DIR = "/tmp/models/random-large"


def shape_params(shape: dict, vocab: int = 49152) -> int:
    """Parameter count of a Llama-shaped decoder with tied embeddings."""
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    return vocab * h + n * per_layer + h


def util_ladder(device_bytes: int, params: int, tries: int = 3) -> list[float]:
    """vLLM utilizations to try at the large size, highest first: the memory plan's
    estimate (what training state and a fixed reserve leave), then `UTIL_STEP` lower."""
    planned = (device_bytes - params * TRAINING_STATE_BYTES_PER_PARAM - UTIL_RESERVE_BYTES) / device_bytes
    top = int(planned * 100) / 100
    return [round(top - k * UTIL_STEP, 2) for k in range(tries) if top - k * UTIL_STEP >= 0.05]


def pick_large_shape(device_bytes: int) -> str:
    for name, shape in LARGE_SHAPES.items():  # largest first
        if shape_params(shape) * TRAINING_STATE_BYTES_PER_PARAM <= 0.85 * device_bytes:
            return name
    raise SystemExit(f"no large shape fits {device_bytes / 2**30:.0f} GiB")


# Most important first: a run cut by the time budget keeps the headline comparison.
DEFAULT_CONTENDERS = "trl-sleep,ours-auto,trl-nosleep,ours-auto-offload,ours-off,ours-level2"
# At the large size sleeping is what lets both fit: the target is the sleep-on pair.
DEFAULT_LARGE_CONTENDERS = "trl-sleep,ours-auto,ours-level1,trl-nosleep"
CONTENDERS = ("trl-sleep", "trl-nosleep", "ours-off", "ours-level1", "ours-level2", "ours-auto")


# The DeepSpeed file a contender trains under (`contender@plain` / `contender@product` picks
# one). `plain` is ZeRO-3 with DeepSpeed's defaults: what TRL's docs and accelerate's
# `zero_stage: 3` give a TRL user. `product` is what our operator renders for the same
# one-GPU job (colocgrpo_operator.render), which is how our trainer runs in a pod. `none` is no
# DeepSpeed at all: plain `accelerate launch`, the bf16 model, the trainer's default torch AdamW
# (`trl-sleep@none`: TRL as its quickstart runs it, the reference beside TRL under ZeRO-3).
DEEPSPEED_FILES = ("plain", "product", "none")


def check_contender(name: str) -> str:
    trainer, _, deepspeed = name.partition("@")
    base = trainer.removesuffix("-offload")
    if base not in CONTENDERS or (trainer.endswith("-offload") and not base.startswith("ours-")):
        raise argparse.ArgumentTypeError(
            f"unknown contender {name!r}: trl-sleep, trl-nosleep, ours-<off|level1|level2|auto>[-offload], "
            f"each optionally @plain, @product or @none"
        )
    if deepspeed and deepspeed not in DEEPSPEED_FILES:
        raise argparse.ArgumentTypeError(f"unknown DeepSpeed file {deepspeed!r} in {name!r}: @plain, @product or @none")
    return name


def deepspeed_choice(contender: str) -> str:
    """`plain` for TRL, `product` for ours, unless the name says otherwise."""
    trainer, _, deepspeed = contender.partition("@")
    return deepspeed or ("product" if trainer.startswith("ours-") else "plain")


PLAIN_DEEPSPEED = {
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
}


def product_deepspeed(offload_trainer_state: bool = False, gpus: int = 1, tensor_parallel_size: int = 1) -> dict:
    """deepspeed.json as the operator renders it for a job of one node with `gpus` GPUs (one by
    default), with or without `vllm.offloadTrainerState` (the `-offload` contenders)."""
    from colocgrpo_operator.render import deepspeed_config

    job = machine_job(gpus=gpus, offload_trainer_state=offload_trainer_state, tensor_parallel_size=tensor_parallel_size)
    return deepspeed_config(job)


def deepspeed_file_key(contender: str) -> str:
    """Which written file a contender's launcher gets: its choice, and for our `-offload`
    contenders the product render of a job that offloads trainer state."""
    choice = deepspeed_choice(contender)
    offload = contender.partition("@")[0].endswith("-offload")
    return f"{choice}-offload" if choice == "product" and offload else choice


def grpo_kwargs(
    contender: str,
    out: Path,
    steps: int,
    cpu: bool = False,
    config: dict = CONFIG,
    util: float | None = None,
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
):
    """The GRPOConfig arguments of one contender (identical for all but the sleep switch). The
    size's per-device batch is the step's micro-batch on one GPU: `num_processes` share it."""
    util = util if util is not None else config["gpu_memory_utilization"]
    return dict(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=config["per_device_train_batch_size"] // num_processes,
        num_generations=config["num_generations"],
        max_completion_length=config["max_completion_length"],
        gradient_accumulation_steps=config["gradient_accumulation_steps"],
        steps_per_generation=config["steps_per_generation"],
        learning_rate=config["learning_rate"],
        max_steps=steps,
        beta=0.0,
        bf16=not cpu,
        seed=config["seed"],
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=util,
        vllm_max_model_length=config["max_model_len"],
        vllm_enable_sleep_mode=contender.partition("@")[0] == "trl-sleep",
        vllm_tensor_parallel_size=tensor_parallel_size,
        model_init_kwargs={"dtype": "float32" if cpu else "bfloat16"},
        # accelerate hands DeepSpeed no backend on a machine without CUDA (and then counts one process);
        # without DeepSpeed one process needs no process group.
        ddp_backend="gloo" if cpu and deepspeed_choice(contender) != "none" else None,
    )


# ---------------------------------------------------------------- worker (one contender)
class PeakSampler:
    """Whole-device memory in use (vLLM allocates outside torch's allocator), sampled every
    20 ms on a thread: the peak falls inside generate or the backward pass, not at a step edge."""

    def __init__(self, interval_s: float = 0.02) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        import torch

        while not self._stop.wait(interval_s):
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def time_trl_vllm(trainer) -> dict:
    """The same breakdown for TRL as our counters give (TRL logs none): wrap its engine's
    sleep / wake_up / generate and its `sync_weights` (empty_cache + weight wake + per-
    parameter push + prefix-cache reset). Wake time runs from the start of `sync_weights` to
    the end of its weight wake, so `empty_cache` counts as wake for both trainers."""
    gen = trainer.vllm_generation
    llm = gen.llm
    timers = {"push_seconds": 0.0, "sleep_seconds": 0.0, "wake_seconds": 0.0, "generate_seconds": 0.0, "pushes": 0}
    state = {"sync_start": None}

    def timed(fn, key):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                end = time.perf_counter()
                if key == "wake_seconds" and state["sync_start"] is not None:
                    timers[key] += end - state["sync_start"]  # includes the empty_cache before it
                    state["sync_start"] = end  # the push starts here
                else:
                    timers[key] += end - start

        return wrapper

    llm.sleep = timed(llm.sleep, "sleep_seconds")
    llm.wake_up = timed(llm.wake_up, "wake_seconds")
    llm.generate = timed(llm.generate, "generate_seconds")
    sync = gen.sync_weights

    def timed_sync(*a, **k):
        state["sync_start"] = time.perf_counter()
        try:
            return sync(*a, **k)
        finally:
            timers["push_seconds"] += time.perf_counter() - state["sync_start"]
            timers["pushes"] += 1
            state["sync_start"] = None

    gen.sync_weights = timed_sync
    return timers


def worker(
    contender: str,
    out: Path,
    warmup: int,
    measured: int,
    cpu: bool = False,
    size: str = "small",
    model: str = MODEL,
    util: float | None = None,
    profile_steps: tuple[int, ...] = (),
    num_processes: int = 1,
    tensor_parallel_size: int = 1,
    generate_only: int = 0,
    no_grad_tokens: int | None = None,
    section_times: bool = False,
    defer_old_logps: bool = True,
) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Explain."}]}
        for a in range(1, 30)
        for b in range(1, 30)
    ]
    from trl import GRPOConfig

    config = SIZES[size]
    util = util if util is not None else config["gpu_memory_utilization"]
    grpo = grpo_kwargs(
        contender,
        out,
        warmup + measured,
        cpu,
        config=config,
        util=util,
        num_processes=num_processes,
        tensor_parallel_size=tensor_parallel_size,
    )
    cuda = torch.cuda.is_available() and not cpu

    def reward(completions, **kwargs):
        return [float(len(c[-1]["content"]) % 7) for c in completions]

    contender = contender.partition("@")[0]  # the DeepSpeed file was the launcher's business
    merge = None
    if contender.startswith("trl-"):
        # TRL as its users configure it: the micro-batch as given.
        trainer = GRPOTrainer(
            model=model, reward_funcs=[reward], args=GRPOConfig(**grpo), train_dataset=Dataset.from_list(rows)
        )
    else:
        from colocgrpo_training.config import VLLMSettings
        from colocgrpo_training.generation import ColocGRPOTrainer
        from colocgrpo_training.micro_batching import merge_micro_batches

        policy = contender.removeprefix("ours-").removesuffix("-offload")
        settings = VLLMSettings(
            tensor_parallel_size=tensor_parallel_size,
            sleep_policy=policy,
            gpu_memory_utilization=util,
            max_model_len=config["max_model_len"],
            offload_trainer_state=contender.endswith("-offload"),
        )
        # A real job's micro-batch merge (grpo_args.build_grpo_config), on the same facts: this process's GPU,
        # world size and DeepSpeed file; prompts of PROMPT_TOKENS, as a job's dataset.maxPromptTokens would say.
        grpo, merge = merge_micro_batches(
            grpo,
            model=model,
            dtype=grpo["model_init_kwargs"]["dtype"],
            vllm=settings,
            max_prompt_tokens=PROMPT_TOKENS,
        )
        print(f"[bench] {contender}: {merge.message()}", flush=True)
        extra: dict = {"defer_old_logps": defer_old_logps}
        if no_grad_tokens is not None:
            extra["no_grad_tokens"] = no_grad_tokens
        trainer = ColocGRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=GRPOConfig(**grpo),
            train_dataset=Dataset.from_list(rows),
            generation_settings=settings,
            **extra,
        )
    if generate_only:
        result = generate_only_run(trainer, rows, config, generate_only, cuda, contender.startswith("trl-"))
        result.update(contender=contender, gpu_memory_utilization=util, size=size)
        if int(os.environ.get("RANK", "0")) == 0:
            (out / "result.json").write_text(json.dumps(result, indent=2))
        return

    times: list[float] = []
    peaks: list[int] = []
    log_entries: list[dict] = []
    sections = None
    if section_times:
        from bench.step_sections import SectionTimer

        sections = SectionTimer(torch.cuda.synchronize if cuda else None, torch.is_grad_enabled)
        sections.wrap_trainer(trainer)

    class Timer(TrainerCallback):
        profiler = None

        def on_train_begin(self, *a, **k):
            if sections is not None and trainer.is_deepspeed_enabled:
                sections.wrap_engine(trainer.model_wrapped)  # the DeepSpeed engine, built by now

        def on_step_begin(self, *a, **k):
            if len(times) + 1 in profile_steps:
                # Where a step's time goes (ops by self CPU and CUDA time): the step's own
                # time is then not comparable, so profiled steps are reported apart.
                self.profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]
                    + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
                )
                self.profiler.__enter__()
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)
            if sections is not None:
                sections.close_step(times[-1])
            if self.profiler is not None:
                self.profiler.__exit__(None, None, None)
                table = self.profiler.key_averages()
                with open(out / f"profile-step{len(times)}.txt", "w") as f:
                    for key in ("self_cpu_time_total", "self_device_time_total" if cuda else None):
                        if key:
                            f.write(
                                f"== by {key}\n{table.table(sort_by=key, row_limit=40, max_name_column_width=70)}\n"
                            )
                self.profiler = None
            if cuda:
                free, total = torch.cuda.mem_get_info()
                peaks.append(total - free)

        def on_log(self, a, state, control, logs=None, **k):
            if logs:
                log_entries.append({key: v for key, v in logs.items() if isinstance(v, (int, float))})

    trainer.add_callback(Timer())
    trl_timers = time_trl_vllm(trainer) if contender.startswith("trl-") and not cpu else None
    with PeakSampler() if cuda else nullcontext() as sampler:
        trainer.train()
    # Profiled steps carry the profiler's own overhead: left out of the statistics.
    measured_times = [t for i, t in enumerate(times) if i >= warmup and i + 1 not in profile_steps] or times
    last = log_entries[-1] if log_entries else {}
    breakdown = {}
    if hasattr(trainer, "generation_metrics"):
        breakdown = trainer.generation_metrics()
    elif trl_timers is not None:
        breakdown = {f"generation/{k}": v for k, v in trl_timers.items()}
    logp_diffs = [
        e["sampling/sampling_logp_difference/mean"]
        for e in log_entries
        if "sampling/sampling_logp_difference/mean" in e
    ]
    result = {
        "contender": contender,
        "num_processes": num_processes,
        "tensor_parallel_size": tensor_parallel_size,
        "median_s_per_step": statistics.median(measured_times),
        "warmup_steps": warmup,
        "measured_steps": len(measured_times),
        "profiled_steps": sorted(profile_steps),
        "step_times": times,
        "peak_device_bytes_at_step_end": max(peaks) if peaks else 0,
        "peak_device_bytes_sampled": sampler.peak if sampler is not None else 0,
        "size": size,
        "gpu_memory_utilization": util,
        "breakdown_total_seconds": breakdown,
        "profiling": {k: v for k, v in last.items() if k.startswith("profiling/")},
        "logp_diff": statistics.mean(logp_diffs) if logp_diffs else None,
        "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in trainer.model.parameters()),
        "micro_batch_merge": merge.to_dict() if merge is not None else None,
        # --section-times: every section edge waited for the GPU, so these step times are not comparable
        "section_seconds": sections.summary(skip=warmup) if sections is not None else None,
        "section_steps": sections.steps if sections is not None else None,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "result.json").write_text(json.dumps(result, indent=2))


def generate_only_run(trainer, rows: list[dict], config: dict, repetitions: int, cuda: bool, trl: bool) -> dict:
    """One generation batch as the training run makes it (per_device_train_batch_size x
    steps_per_generation sequences: prompts each `num_generations` times, the trainer's own sampling
    parameters from the shared GRPOConfig) through the trainer's engine, 1 + `repetitions` times with
    no training between: the whole call (wake, push, generate, sleep as the trainer does them) and
    vLLM's `generate` alone. The first call is reported apart (the first push)."""
    import torch

    tokenizer = trainer.processing_class
    sequences = config["per_device_train_batch_size"] * config["steps_per_generation"]
    prompts = []
    for row in rows[: sequences // config["num_generations"]]:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    batch = [p for p in prompts for _ in range(config["num_generations"])]  # as TRL repeats them
    engine = trainer.vllm_generation
    timers = time_trl_vllm(trainer) if trl else None

    def generate_seconds() -> float:
        return timers["generate_seconds"] if timers is not None else engine.generate_seconds

    calls, generates, completion_tokens = [], [], []
    for _ in range(repetitions + 1):
        if cuda:
            torch.cuda.synchronize()
        before = generate_seconds()
        start = time.perf_counter()
        _, completions, _, _ = engine.generate(batch, None, config["num_generations"])
        if cuda:
            torch.cuda.synchronize()
        calls.append(time.perf_counter() - start)
        generates.append(generate_seconds() - before)
        completion_tokens.append(sum(len(c) for c in completions))
    return {
        "mode": "generate-only",
        "sequences": len(batch),
        "repetitions": repetitions,
        "call_seconds": calls,
        "generate_seconds": generates,
        "completion_tokens": completion_tokens,
        "median_call_s": statistics.median(calls[1:]) if repetitions else calls[0],
        "median_generate_s": statistics.median(generates[1:]) if repetitions else generates[0],
        "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in trainer.model.parameters()),
    }


def host_info(repo: Path = REPO) -> dict:
    """What the step times depend on besides our code: the host CPU (these steps are CPU-bound), the
    GPU and its driver, and the commit measured."""
    import platform
    import subprocess

    info: dict = {"hostname": platform.node(), "cpu_count": os.cpu_count()}
    with suppress(OSError):  # tells machines apart where every host has the same name
        info["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info.setdefault("cpu_model", platform.processor() or "unknown")
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["gpu"] = gpu.stdout.strip().splitlines()[0] if gpu.returncode == 0 and gpu.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    commit = os.environ.get("COLOCGRPO_COMMIT")
    if not commit:
        try:
            git = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
            )
            commit = git.stdout.strip() if git.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    info["commit"] = commit or "unknown"
    info["measured_code"] = working_tree_code(repo)
    return info


def pair_order(pair: list[str], index: int) -> list[str]:
    """The run's contenders in run order: the list rotated left by `index`, so that consecutive runs
    (index 0, 1, 2, ...) change which contender meets the machine first. For a pair A,B that is A
    first for an even index and B first for an odd one; for three, each takes every position once
    in three runs."""
    shift = index % len(pair)
    return list(pair[shift:]) + list(pair[:shift])


def incomplete(results: list[dict]) -> list[str]:
    """Contenders that did not give a measurement: a run with any of them is not a result."""
    done = "median_call_s" if any(r.get("mode") == "generate-only" for r in results) else "median_s_per_step"
    return [f"{r['contender']}: {r.get('status', 'failed')}" for r in results if done not in r]


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
    return {
        "hbm_bytes_per_s": bandwidth,
        "bf16_flop_per_s": flops,
        "device": torch.cuda.get_device_name(),
        "total_bytes": torch.cuda.get_device_properties(0).total_memory,
    }


def floor_seconds(machine: dict, params: int, config: dict = CONFIG) -> dict:
    """Per optimizer step: decode bytes ÷ HBM bandwidth + 6 · params · tokens ÷ bf16 FLOP/s."""
    completions = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    tokens = completions * (PROMPT_TOKENS + config["max_completion_length"])
    # One generation serves steps_per_generation micro-batches, i.e. several optimizer steps.
    generations_per_step = config["gradient_accumulation_steps"] / config["steps_per_generation"]
    decode_bytes = params * 2 * config["max_completion_length"] * generations_per_step
    decode = decode_bytes / machine["hbm_bytes_per_s"]
    train = 6 * params * tokens / machine["bf16_flop_per_s"]
    return {"decode_s": decode, "train_s": train, "floor_s_per_step": decode + train}


# ---------------------------------------------------------------- parent
def write_report(
    out: Path,
    machine: dict,
    results: list[dict],
    warmup: int,
    measured: int,
    size: str = "small",
    model: dict | None = None,
    shape: dict | None = None,
    run: dict | None = None,
) -> list[str]:
    config = SIZES[size]
    run = run or {}
    shape = shape or {"num_processes": 1, "tensor_parallel_size": 1}
    params = next((r["params"] for r in results if "params" in r), 0)
    floor = floor_seconds(machine, params, config) if machine.get("hbm_bytes_per_s") and params else {}
    summary = {
        "size": size,
        **shape,
        "model": model or {"path": MODEL},
        "config": {**config, "warmup_steps": warmup, "measured_steps": measured},
        "machine": machine,
        "floor": floor,
        **run,
        "incomplete": incomplete(results),
        "results": results,
    }
    (out / "bench.json").write_text(json.dumps(summary, indent=2))
    host = run.get("host", {})
    lines = [
        f"{shape['num_processes']} process(es), vLLM TP {shape['tensor_parallel_size']}; "
        f"host CPU {host.get('cpu_model', '?')} ({host.get('cpu_count', '?')} cores), GPU {host.get('gpu', '?')}, "
        f"commit {str(host.get('commit', '?'))[:12]}"
        + (f"; pair {','.join(run['pair'])} index {run['pair_index']}" if run.get("pair") else ""),
        "",
        "| contender | DeepSpeed file | util | median s/step | mean s/step | peak device GiB (sampled) "
        "| push s | sleep s | wake s | generate s | offload s | logp diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if run.get("generate_only"):
        lines[2:] = generate_only_table(results)
        results = []
    for r in results:
        if "median_s_per_step" not in r:
            lines.append(
                f"| {r['contender']} | {deepspeed_file_key(r['contender'])} | {r.get('gpu_memory_utilization', '')} "
                f"| {r.get('status', 'failed')} | | | | | | | | |"
            )
            continue
        b = r["breakdown_total_seconds"]
        profiled = set(r.get("profiled_steps", ()))
        measured_times = [
            t for i, t in enumerate(r["step_times"]) if i >= r["warmup_steps"] and i + 1 not in profiled
        ] or r["step_times"]
        logp = r.get("logp_diff")
        lines.append(
            f"| {r['contender']} | {deepspeed_file_key(r['contender'])} | {r.get('gpu_memory_utilization')} "
            f"| {r['median_s_per_step']:.3f} | "
            f"{statistics.mean(measured_times):.3f} | {r.get('peak_device_bytes_sampled', 0) / 2**30:.1f} | "
            + " | ".join(
                f"{b.get('generation/' + k, float('nan')):.3f}"
                for k in ("push_seconds", "sleep_seconds", "wake_seconds", "generate_seconds", "offload_seconds")
            )
            + f" | {logp if logp is None else f'{logp:.4f}'} |"
        )
    for r in results:
        for attempt in r.get("failed_attempts", []):
            lines.append(f"\n{r['contender']}: util {attempt['util']} {attempt['status']}")
        if merge := r.get("micro_batch_merge"):
            rows, steps = merge["per_device_train_batch_size"], merge["gradient_accumulation_steps"]
            lines.append(
                f"\n{r['contender']}: micro-batches of {rows[1]} rows x {steps[1]} per optimizer step "
                f"(merge factor {merge['factor']}; set {rows[0]} x {steps[0]}): {merge['reason']}"
            )
    if floor:
        lines.append(
            f"\nfloor: {floor['floor_s_per_step']:.4f} s/step for {params / 1e9:.2f}B parameters "
            f"on {machine['device']} "
            f"({machine['hbm_bytes_per_s'] / 1e12:.2f} TB/s, {machine['bf16_flop_per_s'] / 1e12:.0f} TFLOP/s bf16)"
        )
    lines += [f"\nNOT MEASURED: {line}" for line in summary["incomplete"]]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    return lines


def generate_only_table(results: list[dict]) -> list[str]:
    lines = [
        "| contender | DeepSpeed file | util | sequences | median whole call s | median vLLM generate s "
        "| first call s | every generate s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "median_call_s" not in r:
            lines.append(f"| {r['contender']} | {deepspeed_file_key(r['contender'])} | | | {r.get('status')} | | | |")
            continue
        lines.append(
            f"| {r['contender']} | {deepspeed_file_key(r['contender'])} | {r.get('gpu_memory_utilization')} "
            f"| {r['sequences']} | {r['median_call_s']:.3f} | {r['median_generate_s']:.3f} "
            f"| {r['call_seconds'][0]:.3f} "
            f"| {', '.join(f'{t:.3f}' for t in r['generate_seconds'])} |"
        )
    return lines


OOM_MARKERS = ("out of memory", "outofmemoryerror", "no available memory for the cache blocks", "free memory on device")


def ran_out_of_memory(work: Path) -> bool:
    text = ""
    for name in ("stderr.log", "stdout.log"):
        if (work / name).exists():
            text += (work / name).read_text(errors="replace")[-200_000:].lower()
    return any(marker in text for marker in OOM_MARKERS)


def make_large_model(model_dir: Path, tokenizer_from: str) -> dict:
    """Random-init decoder of SmolLM2's family, sized by `pick_large_shape`; kept across
    calls on the same machine (a marker file names its shape)."""
    import torch
    import transformers

    marker = model_dir / "colocgrpo-shape.json"
    shape_name = pick_large_shape(torch.cuda.get_device_properties(0).total_memory)
    if marker.exists() and json.loads(marker.read_text()).get("shape") == shape_name:
        return json.loads(marker.read_text())
    start = time.perf_counter()
    shape = LARGE_SHAPES[shape_name]
    config = transformers.AutoConfig.from_pretrained(tokenizer_from)
    for key, value in shape.items():
        setattr(config, key, value)
    config.head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="5GB")
    transformers.AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(model_dir)
    info = {
        "shape": shape_name,
        **shape,
        "params": sum(p.numel() for p in model.parameters()),
        "path": str(model_dir),
        "seconds_to_create": time.perf_counter() - start,
    }
    marker.write_text(json.dumps(info, indent=2))
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--contenders",
        default=None,
        type=lambda v: [check_contender(c) for c in v.split(",") if c],
        help=f"default: {DEFAULT_CONTENDERS} (small), {DEFAULT_LARGE_CONTENDERS} (large)",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--model-dir", type=Path, default=Path(DEFAULT_LARGE_MODEL_DIR), help="where the large model is made"
    )
    parser.add_argument(
        "--util-ladder",
        default=None,
        help="large size: utilizations to try, highest first (default: from the memory plan)",
    )
    parser.add_argument(
        "--pair",
        default=None,
        type=lambda v: [check_contender(c) for c in v.split(",") if c],
        help="ours and one or more TRL configurations A,B[,C...] (instead of --contenders): one pair of ours "
        "with each TRL contender, in the order --pair-index gives",
    )
    parser.add_argument(
        "--pair-index",
        type=int,
        default=0,
        help="this run's number in a series: the --pair list rotated left by it (A,B: even runs A first)",
    )
    parser.add_argument(
        "--generate-only",
        type=int,
        default=0,
        metavar="N",
        help="no training: the same generation batch through each contender's engine 1 + N times",
    )
    parser.add_argument(
        "--no-grad-tokens",
        type=int,
        default=None,
        help="our contenders: tokens per no-grad forward (0: TRL's chunking; default: the trainer's)",
    )
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--measured-steps", type=int, default=None)
    parser.add_argument("--budget-seconds", type=float, default=480.0, help="start no contender past this")
    parser.add_argument("--contender-timeout", type=float, default=200.0)
    parser.add_argument("--cpu", action="store_true", help="CPU dry run of the plumbing (a vLLM stand-in)")
    parser.add_argument("--num-processes", type=int, default=1, help="training processes, one per GPU")
    parser.add_argument("--tp", type=int, default=1, help="vLLM tensor-parallel size (must divide --num-processes)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)
    parser.add_argument("--util", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-machine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--make-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile-steps",
        default="",
        help="1-based steps to profile with torch.profiler (profile-stepN.txt per contender)",
    )
    parser.add_argument(
        "--no-defer-old-logps",
        action="store_true",
        help="our contenders: old log-probs from a no-grad forward over the whole generation, as TRL "
        "(to measure the trainer's deferral alone)",
    )
    parser.add_argument(
        "--section-times",
        action="store_true",
        help="time the trainer's sections per step (bench/step_sections.py; the GPU syncs at each edge, "
        "so the run's step times are not comparable with others)",
    )
    args = parser.parse_args(argv)
    config = SIZES[args.size]
    args.warmup_steps = config["warmup_steps"] if args.warmup_steps is None else args.warmup_steps
    args.measured_steps = config["measured_steps"] if args.measured_steps is None else args.measured_steps
    if args.pair is not None:
        ours = [c for c in args.pair if c.startswith("ours-")]
        if len(args.pair) < 2 or len(ours) != 1 or args.contenders is not None:
            parser.error("--pair takes one ours-* contender and one or more TRL ones (A,B[,C...]), and no --contenders")
        if len(set(args.pair)) != len(args.pair):
            parser.error("--pair names a contender twice")
        if args.pair_index < 0:
            parser.error("--pair-index must be >= 0")
        args.contenders = pair_order(args.pair, args.pair_index)
    if args.contenders is None:
        args.contenders = (DEFAULT_CONTENDERS if args.size == "small" else DEFAULT_LARGE_CONTENDERS).split(",")
    if args.generate_only < 0:
        parser.error("--generate-only must be >= 0")
    if args.warmup_steps < 0 or args.measured_steps < 1:
        parser.error("--warmup-steps must be >= 0 and --measured-steps >= 1")
    if args.num_processes < 1 or args.tp < 1 or args.num_processes % args.tp:
        parser.error(f"--tp {args.tp} must divide --num-processes {args.num_processes}")
    if config["per_device_train_batch_size"] % args.num_processes:
        parser.error(
            f"--num-processes {args.num_processes} must divide the {args.size} size's "
            f"{config['per_device_train_batch_size']} completions per micro-batch"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    profile_steps = tuple(int(n) for n in args.profile_steps.split(",") if n)
    if args.worker:
        worker(
            args.worker,
            out,
            args.warmup_steps,
            args.measured_steps,
            cpu=args.cpu,
            size=args.size,
            model=args.model,
            util=args.util,
            profile_steps=profile_steps,
            num_processes=args.num_processes,
            tensor_parallel_size=args.tp,
            generate_only=args.generate_only,
            no_grad_tokens=args.no_grad_tokens,
            section_times=args.section_times,
            defer_old_logps=not args.no_defer_old_logps,
        )
        return 0
    if args.measure_machine:
        (out / "machine.json").write_text(json.dumps(measure_machine()))
        return 0
    if args.make_model:
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.json").write_text(json.dumps(make_large_model(args.model_dir, MODEL)))
        return 0
    install_stop_handlers()
    if not Path(MODEL).exists():
        print(f"[bench] model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}",
        VLLM_USE_FLASHINFER_SAMPLER="0",
        PYTHONUNBUFFERED="1",
    )
    # Its own process, so that the parent holds no GPU memory while the contenders run.
    machine: dict = {}
    if not args.cpu:
        code, timed_out = run_child(
            [sys.executable, "-m", "bench.grpo_step", "--out", str(out), "--measure-machine"], env, out, 120
        )
        if code == 0 and (out / "machine.json").exists():
            machine = json.loads((out / "machine.json").read_text())
        else:
            machine = {"error": f"machine measurement failed (rc {code}, timed out {timed_out})"}
    model_info: dict = {"path": MODEL}
    ladder: list[float | None] = [None]  # the size's fixed utilization
    if args.size == "large":
        code, timed_out = run_child(
            [
                sys.executable,
                "-m",
                "bench.grpo_step",
                "--out",
                str(out),
                "--make-model",
                "--model-dir",
                str(args.model_dir),
            ],
            env,
            out,
            400,
        )
        if code != 0 or not (out / "model.json").exists():
            print(
                f"[bench] making the large model failed (rc {code}, timed out {timed_out}):\n"
                + (out / "stderr.log").read_text(errors="replace")[-3000:],
                file=sys.stderr,
            )
            return 2
        model_info = json.loads((out / "model.json").read_text())
        print(
            f"[bench] large model: {model_info['shape']}, {model_info['params'] / 1e9:.2f}B parameters "
            f"at {model_info['path']}",
            flush=True,
        )
        if args.util_ladder:
            ladder = [float(u) for u in args.util_ladder.split(",") if u]
        elif "total_bytes" in machine:
            ladder = util_ladder(machine["total_bytes"], model_info["params"])
        else:
            print(
                f"[bench] no device memory size to plan utilizations from ({machine}); pass --util-ladder",
                file=sys.stderr,
            )
            return 2
        model_info["util_ladder"] = ladder
    deepspeed_files = {}
    for choice, config in (
        ("plain", PLAIN_DEEPSPEED),
        ("product", product_deepspeed(gpus=args.num_processes, tensor_parallel_size=args.tp)),
        (
            "product-offload",
            product_deepspeed(offload_trainer_state=True, gpus=args.num_processes, tensor_parallel_size=args.tp),
        ),
    ):
        deepspeed_files[choice] = out / f"deepspeed-{choice}.json"
        deepspeed_files[choice].write_text(json.dumps(config, indent=2))
    results: list[dict] = []
    last_wall = 100.0  # a first guess of one contender's wall time, then the last one's
    run_info = {
        "host": host_info(),
        "contenders_in_run_order": list(args.contenders),
        "pair": args.pair,
        "pair_index": args.pair_index if args.pair else None,
        "generate_only": args.generate_only,
        "no_grad_tokens": args.no_grad_tokens,
        "defer_old_logps": not args.no_defer_old_logps,
    }

    def report() -> list[str]:
        return write_report(
            out,
            machine,
            results,
            args.warmup_steps,
            args.measured_steps,
            args.size,
            model_info,
            {"num_processes": args.num_processes, "tensor_parallel_size": args.tp},
            run_info,
        )

    for contender in args.contenders:
        failed_attempts: list[dict] = []
        result: dict = {"contender": contender, "status": "skipped (every utilization tried ran out of memory)"}
        # Highest utilization first, for every contender: one contender running out of memory says
        # nothing of another's training state, and must not lower the utilization it is measured at.
        tries = list(ladder)
        for util in list(tries):
            elapsed = time.perf_counter() - began
            if elapsed + last_wall > args.budget_seconds:
                result = {"contender": contender, "status": "skipped (time budget)"}
                print(f"[bench] {contender}: skipped, {elapsed:.0f} s used of {args.budget_seconds:.0f}", flush=True)
                break
            work = out / (contender if util is None else f"{contender}-util{util}")
            work.mkdir(parents=True, exist_ok=True)
            key = deepspeed_file_key(contender)
            launcher = (
                []  # plain accelerate: no DeepSpeed
                if key == "none"
                else [
                    "--use_deepspeed",
                    "--deepspeed_config_file",
                    str(deepspeed_files[key]),
                    "--zero3_init_flag",
                    "true",
                ]
            )
            cmd = (
                [
                    sys.executable,
                    "-m",
                    "accelerate.commands.launch",
                    *launcher,
                    "--num_processes",
                    str(args.num_processes),
                    "--mixed_precision",
                    "no" if args.cpu else "bf16",
                    "--module",
                    "bench.grpo_step",
                    "--worker",
                    contender,
                    "--num-processes",
                    str(args.num_processes),
                    "--tp",
                    str(args.tp),
                    "--out",
                    str(work),
                    "--size",
                    args.size,
                    "--model",
                    model_info["path"],
                    "--warmup-steps",
                    str(args.warmup_steps),
                    "--measured-steps",
                    str(args.measured_steps),
                    "--profile-steps",
                    args.profile_steps,
                ]
                + (["--cpu"] if args.cpu else [])
                + ([] if util is None else ["--util", str(util)])
                + (["--generate-only", str(args.generate_only)] if args.generate_only else [])
                + ([] if args.no_grad_tokens is None else ["--no-grad-tokens", str(args.no_grad_tokens)])
                + (["--section-times"] if args.section_times else [])
                + (["--no-defer-old-logps"] if args.no_defer_old_logps else [])
            )
            start = time.perf_counter()
            timeout = min(args.contender_timeout, max(30.0, args.budget_seconds + 60 - elapsed))
            code, timed_out = run_child(cmd, env, work, timeout)
            wall = time.perf_counter() - start
            last_wall = wall
            if code == 0 and (work / "result.json").exists():
                result = json.loads((work / "result.json").read_text())
                result["wall_s"] = wall
                result["contender"] = contender  # the worker records it without its @file
                result["deepspeed"] = deepspeed_file_key(contender)
                measured = result.get("median_s_per_step", result.get("median_call_s"))
                print(f"[bench] {contender}: {measured:.3f} s at util {util} ({wall:.0f} s wall)", flush=True)
                break
            tail = (work / "stderr.log").read_text(errors="replace")[-3000:]
            status = f"timed out after {timeout:.0f} s" if timed_out else f"failed (rc {code})"
            oom = not timed_out and ran_out_of_memory(work)
            print(
                f"[bench] {contender} at util {util}: {status.upper()}"
                f"{' (out of memory)' if oom else ''}\n{tail[-1500:]}",
                flush=True,
            )
            result = {
                "contender": contender,
                "status": status,
                "error": tail,
                "wall_s": wall,
                "gpu_memory_utilization": util,
            }
            if not oom or util is None:
                break
            status += " (out of memory)"
            failed_attempts.append({"util": util, "status": status, "wall_s": wall})
            tries.remove(util)
        if failed_attempts:
            result["failed_attempts"] = failed_attempts
        results.append(result)
        report()
    lines = report()
    print("\n".join(lines))
    missing = incomplete(results)
    if missing or not results:
        # A run that skipped a contender (time budget, out of memory) or lost one is no comparison.
        print(f"[bench] INCOMPLETE: {'; '.join(missing) or 'no contender ran'}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        # A rank of a contender's launch: it leaves as the trainer's pods do, without the interpreter's
        # finalization, where a torch process-group thread may abort it (colocgrpo_training.entrypoint).
        from colocgrpo_training.entrypoint import exit_process

        exit_process(main())
    sys.exit(main())
