"""One contender's run: the `accelerate launch`-ed process that builds its trainer (TRL's GRPOTrainer
or ours), trains warm-up and measured steps and writes result.json."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

from bench.grpo.contenders import deepspeed_choice, grpo_kwargs, merges_micro_batches
from bench.grpo.prompts import exact_rows, generation_batch, question_rows
from bench.grpo.sizes import MODEL, SIZES
from bench.grpo.vllm_counters import GenerateRecorder, PreemptionCounter, kv_cache_tokens

# Rows of the dataset at a size with exact prompts: enough distinct prompts for a run's steps.
EXACT_ROWS = 64


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
    from trl import GRPOConfig, GRPOTrainer

    config = SIZES[size]
    if config.get("exact_prompts"):
        from transformers import AutoTokenizer

        rows = exact_rows(AutoTokenizer.from_pretrained(model), config["prompt_tokens"], EXACT_ROWS)
    else:
        rows = question_rows()
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

    zero_stage = 0 if deepspeed_choice(contender) == "none" else 3  # plain and product: ZeRO-3 without offloads
    contender = contender.partition("@")[0]  # the DeepSpeed file was the launcher's business
    merge = None
    policy = "auto" if contender == "trl-best" else contender.removeprefix("ours-").removesuffix("-offload")
    settings = None
    if merges_micro_batches(contender):
        from colocgrpo_training.config import DeepSpeedSettings, ResourceSettings, VLLMSettings
        from colocgrpo_training.micro_batching import merge_micro_batches
        from colocgrpo_training.planner import PlanRequest

        # ours-auto's settings for trl-best: its merge is the one ours-auto makes in the same run (with sleep on,
        # the memory plan's training phase does not depend on vLLM's utilization).
        settings = VLLMSettings(
            tensor_parallel_size=tensor_parallel_size,
            sleep_policy=policy,
            gpu_memory_utilization=util,
            max_model_len=config["max_model_len"],
            offload_trainer_state=contender.endswith("-offload"),
        )
        # A real job's micro-batch merge (grpo_args.build_grpo_config), on the same facts: this process's GPU, the
        # launch's processes, the ZeRO stage of the DeepSpeed file it runs under; the size's prompt length, as a
        # job's dataset.maxPromptTokens would say.
        request = PlanRequest(
            model=model,
            dtype=grpo["model_init_kwargs"]["dtype"],
            resources=ResourceSettings(nodes=1, gpus_per_node=num_processes),
            deepspeed=DeepSpeedSettings(zero_stage=zero_stage),
            vllm=settings,
            max_prompt_tokens=config["prompt_tokens"],
            trainer_args=grpo,
        )
        planned, merge = merge_micro_batches(request)
        if contender == "trl-best" and merge.trainer_options():
            # Checkpointing some layers only is our trainer's (TRL's own every_n_layers breaks after the first
            # generation: colocgrpo_training/generation/checkpointing.py): TRL checkpoints every layer.
            merge = dataclasses.replace(merge, recompute=None)
            planned = merge.rewrite(grpo)
        grpo = planned
        print(f"[bench] {contender}: {merge.message()}", flush=True)
    if contender.startswith("trl-"):
        # TRL's own trainer: trl-sleep and trl-nosleep with the micro-batch its users set, trl-best merged.
        trainer = GRPOTrainer(
            model=model, reward_funcs=[reward], args=GRPOConfig(**grpo), train_dataset=Dataset.from_list(rows)
        )
    else:
        from colocgrpo_training.generation import ColocGRPOTrainer

        extra: dict = {"defer_old_logps": defer_old_logps, **(merge.trainer_options() if merge else {})}
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
    engine = trainer.vllm_generation.llm
    generates, preemptions = GenerateRecorder(engine), PreemptionCounter(engine)
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
    # Generations in the warm-up steps: one per steps_per_generation micro-batches, as the run was merged.
    per_generation = grpo["steps_per_generation"] // grpo["gradient_accumulation_steps"]
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
        "micro_batch": [grpo["per_device_train_batch_size"], grpo["gradient_accumulation_steps"]],
        **generates.summary(skip=-(-warmup // max(1, per_generation))),
        "vllm_preemptions": preemptions.count,
        "kv_cache_tokens": kv_cache_tokens(engine),
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

    batch = generation_batch(trainer.processing_class, rows, config)
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
