"""What a run records: the host, the contenders not measured, and bench.json / bench.md."""

from __future__ import annotations

import json
import os
import statistics
from contextlib import suppress
from pathlib import Path

from bench.grpo.contenders import deepspeed_file_key
from bench.grpo.floor import floor_seconds
from bench.grpo.sizes import MODEL, SIZES
from bench.pair_table import working_tree_code

REPO = Path(__file__).resolve().parents[2]


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


def incomplete(results: list[dict]) -> list[str]:
    """Contenders that did not give a measurement: a run with any of them is not a result."""
    done = "median_call_s" if any(r.get("mode") == "generate-only" for r in results) else "median_s_per_step"
    return [f"{r['contender']}: {r.get('status', 'failed')}" for r in results if done not in r]


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
    kv_bytes = (model or {}).get("kv_bytes_per_token", 0)
    floor = floor_seconds(machine, params, config, kv_bytes) if machine.get("hbm_bytes_per_s") and params else {}
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
    lines += engine_table([r for r in results if "median_s_per_step" in r])
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
            f"({machine['hbm_bytes_per_s'] / 1e12:.2f} TB/s, {machine['bf16_flop_per_s'] / 1e12:.0f} TFLOP/s bf16): "
            f"decode {floor['decode_s']:.4f} s (KV cache reads {floor.get('decode_kv_s', 0.0):.4f} s), "
            f"training {floor['train_s']:.4f} s"
        )
    lines += [f"\nNOT MEASURED: {line}" for line in summary["incomplete"]]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    return lines


def engine_table(results: list[dict]) -> list[str]:
    """Per measured contender: the micro-batch it trained, its vLLM generate calls after the warm-up (median
    seconds, sequences, prompt and completion lengths), the KV cache's capacity against what one generation
    needs at those lengths, and the requests vLLM preempted ('?' where not readable)."""
    if not results:
        return []
    lines = [
        "",
        "| contender | micro-batch | generate s per call (median) | sequences | prompt tokens | completion tokens "
        "| KV cache tokens (one generation needs) | vLLM preemptions |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def span(pair: list[int] | None) -> str:
        return "?" if not pair else str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}–{pair[1]}"

    for r in results:
        rows, steps = r.get("micro_batch") or ["?", "?"]
        prompts, completions = r.get("prompt_tokens_range"), r.get("completion_tokens_range")
        sequences = r.get("sequences_per_generate")
        needed = sequences * (prompts[1] + completions[1]) if sequences and prompts and completions else None
        kv = r.get("kv_cache_tokens")
        generate = r.get("generate_s_median")
        preemptions = r.get("vllm_preemptions")
        lines.append(
            f"| {r['contender']} | {rows} x {steps} | {'?' if generate is None else f'{generate:.3f}'} "
            f"| {sequences or '?'} | {span(prompts)} | {span(completions)} "
            f"| {'?' if kv is None else f'{kv:,}'} ({'?' if needed is None else f'{needed:,}'}) "
            f"| {'?' if preemptions is None else preemptions} |"
        )
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
