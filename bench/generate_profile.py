"""Where one short vLLM generate spends its time: the trainer's engine, the pair bench's generation batch, and the
same generate with one thing taken out at a time.

    python -m bench.generate_profile --out DIR [--size large] [--reps 5] [--budget-seconds 230] [--cpu]

One process builds one vLLM engine with the trainer's own keyword arguments (`vllm_engine.engine_kwargs`: in this
process through `external_launcher`, sleep mode on, processed log-probs, TP 1) on the size's model (`large`: the
bench's random-init decoder, made here if absent, bench/grpo/model.py) at a fixed vLLM utilization (`--util`, 0.5:
a generate-only run shares the GPU with no training state, and 0.5 holds the batch's KV cache many times over). The
batch is the pair bench's (`prompts.generation_batch`: at `large` 16 prompts x 8 = 128 sequences), sampled as the
trainer samples (`vllm_engine.sampling_base` with TRL's defaults and `logprobs=0`) with `ignore_eos`, so that every
sequence decodes exactly `max_completion_length` tokens (the large size does not set it; a random model rarely
samples the end-of-sequence token, and one that did would shorten the decode being measured).

The variants, each 1 warm-up and `--reps` timed generates (the prefix cache reset before each, as the trainer's
wake or push resets it):

- `trainer`: the trainer's sampling;
- `no-logprobs`: without the sampled tokens' log-probs (`logprobs=None`);
- `detokenize`: with vLLM's detokenization (`detokenize=True`, TRL's default; the trainer reads token ids only and
  turns it off);
- `greedy`: temperature 0 (argmax: no top-k/top-p sampler, no log-softmax);
- `prefill-only`: one token per sequence (`max_tokens=1`): the prefill and one sampling step;
- `after-wake`: the trainer's sampling right after a level-1 sleep and a wake as the controller wakes (weights,
  then KV cache, then the prefix cache reset), timed apart from the generate after it.

Beside them: the decode floor (the bf16 weights read once per token step at the HBM bandwidth `bench.grpo.floor`
measures; the prefill left out) and each variant against it, and one `trainer` generate under torch.profiler: the
GPU's busy time (the union of its kernels and copies) against the generate's wall time, and the 25 ops with the most
self CPU and self CUDA time. A GPU busy for a small part of the wall time means the decode waits on the CPU
(scheduling, Python, sampling bookkeeping), not on the GPU.

A variant that fails is recorded with its error and the rest still run; no variant or profile starts that would end
past `--budget-seconds` (counted from the start, the model and the engine included; a step's time is guessed from
the last one's), and the report says which were skipped. Writes DIR/generate_profile.json,
DIR/generate_profile.md (printed too) and DIR/generate_profile_ops.txt (the op tables).

`--cpu`: a dry run of the plumbing on CPU with the vLLM stand-in (tests/support/cpu_vllm.py) and the `cpu` size
(the tiny model unless COLOCGRPO_TEST_MODEL names one); the bandwidth is a host memory copy, the profile CPU-only.
Never a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.grpo.model import model_dir
from bench.grpo.sizes import MODEL, SIZES

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("trainer", "no-logprobs", "detokenize", "greedy", "prefill-only", "after-wake")
# What each variant changes in the trainer's sampling.
VARIANT_CHANGES: dict[str, dict[str, Any]] = {
    "trainer": {},
    "no-logprobs": {"logprobs": None},
    "detokenize": {"detokenize": True},
    "greedy": {"temperature": 0.0},
    "prefill-only": {"max_tokens": 1},
    "after-wake": {},
}
DEFAULT_UTIL = 0.5
TOP_OPS = 25
POST_PROCESSING_S = 120  # torch.profiler parses its events for at most this long, then keeps what it has
BF16_BYTES = 2
JSON_NAME, MD_NAME, OPS_NAME = "generate_profile.json", "generate_profile.md", "generate_profile_ops.txt"


class ProfileError(RuntimeError):
    """The profile cannot go on (no model, no engine); the report says why."""


# -- pure arithmetic -----------------------------------------------------------------------------------------------
def variant_sampling(name: str, base: dict[str, Any]) -> dict[str, Any]:
    """The sampling keyword arguments of variant `name`: the trainer's (`base`) with the variant's change."""
    return {**base, **VARIANT_CHANGES[name]}


def timing_summary(seconds: list[float]) -> dict[str, Any]:
    """Median, min and max of the timed generates."""
    return {
        "reps": len(seconds),
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
    }


def decode_floor(params: int, bytes_per_s: float, steps: int, bytes_per_param: int = BF16_BYTES) -> dict[str, Any]:
    """The decode's floor: every token step reads the weights once (bf16: 2 bytes per parameter) at `bytes_per_s`.
    The prefill and the KV cache's reads are left out (short prompts and completions: the weights dominate)."""
    weight_bytes = params * bytes_per_param
    per_step = weight_bytes / bytes_per_s
    return {
        "params": params,
        "weight_bytes": weight_bytes,
        "bytes_per_s": bytes_per_s,
        "decode_steps": steps,
        "per_step_s": per_step,
        "floor_s": steps * per_step,
    }


def with_floor(result: dict[str, Any], floor: dict[str, Any] | None) -> dict[str, Any]:
    """`result` with its wall time per token step and both against the floor: the whole generate against the
    64-step decode floor, a token step (the median over the tokens each sequence got) against one step's floor."""
    out = dict(result)
    steps = out.get("tokens_per_sequence")
    median = out.get("median_s")
    if median is None or not steps:
        return out
    out["s_per_token_step"] = median / steps
    if floor is not None:
        out["ratio_to_floor"] = median / floor["floor_s"]
        out["step_ratio_to_floor"] = out["s_per_token_step"] / floor["per_step_s"]
    return out


def interval_union(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: the time a device was busy, overlapping work counted once."""
    total, end = 0.0, None
    start = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None and start is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None and start is not None:
        total += end - start
    return total


def differences(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What each change saved, from the medians of the measured variants (positive: the trainer's generate is slower
    by that much), and the decode's share: the trainer's generate less the prefill-only one."""
    median = {name: v["median_s"] for name, v in variants.items() if v.get("status") == "measured" and "median_s" in v}
    out: dict[str, float] = {}
    # What each costs: the variant with it less the variant without it.
    pairs = {
        "logprobs_s": ("trainer", "no-logprobs"),
        "detokenize_s": ("detokenize", "trainer"),
        "sampling_s": ("trainer", "greedy"),
    }
    if "trainer" in median:
        for key, (slower, faster) in pairs.items():
            if slower in median and faster in median:
                out[key] = median[slower] - median[faster]
        if "prefill-only" in median:
            out["prefill_and_first_token_s"] = median["prefill-only"]
            out["decode_after_first_token_s"] = median["trainer"] - median["prefill-only"]
            steps = variants["trainer"].get("tokens_per_sequence")
            if steps and steps > 1:
                out["decode_s_per_step"] = out["decode_after_first_token_s"] / (steps - 1)
    wake = variants.get("after-wake", {})
    if wake.get("status") == "measured" and "later" in wake:
        out["first_after_wake_s"] = wake["median_s"] - wake["later"]["median_s"]
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_markdown(report: dict[str, Any]) -> list[str]:
    """The report's table and its key lines."""
    model, floor, profile = report.get("model", {}), report.get("floor"), report.get("profile") or {}
    lines = [
        f"# Where a short generate goes ({report.get('device', '?')}, commit {report.get('commit', '?')})",
        "",
    ]
    if report.get("cpu_dry_run"):
        lines += ["CPU DRY RUN with the vLLM stand-in: the plumbing only, no measurement.", ""]
    params = model.get("params")
    count = "?" if not params else f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params:,}"
    lines.append(f"Model: {model.get('kind', '?')}, shape {model.get('shape') or '—'}, {count} parameters")
    cfg = report.get("batch", {})
    lines.append(
        f"Batch: {cfg.get('sequences', '?')} sequences ({cfg.get('prompts', '?')} prompts x "
        f"{cfg.get('num_generations', '?')}), prompts {cfg.get('prompt_tokens_min', '?')}-"
        f"{cfg.get('prompt_tokens_max', '?')} tokens, {cfg.get('completion_tokens', '?')} completion tokens each "
        f"(ignore_eos); vLLM utilization {report.get('engine', {}).get('gpu_memory_utilization', '?')}"
    )
    if floor:
        lines.append(
            f"Decode floor: {floor['decode_steps']} steps x {floor['weight_bytes'] / 1e9:.2f} GB / "
            f"{floor['bytes_per_s'] / 1e12:.2f} TB/s = {floor['floor_s']:.3f} s ({floor['per_step_s'] * 1e3:.2f} ms "
            "a step; prefill excluded)"
        )
    lines += [
        "",
        "| variant | status | reps | median s | min s | max s | tokens | ÷ floor | ms per token step | ÷ step floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in report.get("order", []):
        v = report["variants"].get(name, {})
        step = v.get("s_per_token_step")
        lines.append(
            f"| {name} | {v.get('status', '?')} | {_fmt(v.get('reps'))} | {_fmt(v.get('median_s'))} | "
            f"{_fmt(v.get('min_s'))} | {_fmt(v.get('max_s'))} | {_fmt(v.get('tokens'))} | "
            f"{_fmt(v.get('ratio_to_floor'), 2)} | {_fmt(None if step is None else step * 1e3, 2)} | "
            f"{_fmt(v.get('step_ratio_to_floor'), 2)} |"
        )
        if name == "after-wake" and "later" in v:
            later = v["later"]
            lines.append(
                f"| after-wake, the next generate | {v.get('status')} | {later['reps']} | {_fmt(later['median_s'])} | "
                f"{_fmt(later['min_s'])} | {_fmt(later['max_s'])} | | | | |"
            )
    lines.append("")
    if profile.get("status") == "measured":
        busy = profile.get("gpu_busy_s")
        if busy is not None:
            lines.append(
                f"Profiled trainer generate: GPU busy {busy:.3f} s of {profile['wall_s']:.3f} s wall "
                f"({100 * profile['gpu_busy_fraction']:.0f} %; kernels and copies summed "
                f"{profile['device_sum_s']:.3f} s; {_fmt(profile.get('gpu_busy_fraction_of_unprofiled'), 2)} of the "
                f"unprofiled median). Op tables: {OPS_NAME}."
            )
        else:
            lines.append(f"Profiled trainer generate: {profile['wall_s']:.3f} s wall, CPU only. Op tables: {OPS_NAME}.")
    elif profile:
        lines.append(f"Profile: {profile.get('status')}")
    if profile.get("note"):
        lines.append(f"Profile note: {profile['note']}")
    if report.get("error"):
        lines.append(f"STOPPED: {report['error'].splitlines()[0]}")
    diff = report.get("differences") or {}
    if diff:
        lines.append(
            "Differences of the medians (s): " + ", ".join(f"{key} {value:+.3f}" for key, value in diff.items())
        )
    for note in report.get("notes", []):
        lines.append(f"Note: {note}")
    return lines


# -- the run -------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.generate_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default: large (--cpu: cpu)")
    parser.add_argument("--reps", type=int, default=5, help="timed generates per variant, after 1 warm-up")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        type=lambda v: [name for name in v.split(",") if name],
        help=f"comma-separated, in run order (default and choices: {','.join(VARIANTS)})",
    )
    parser.add_argument(
        "--budget-seconds", type=float, default=230.0, help="start no variant that would end past this (from start)"
    )
    parser.add_argument("--util", type=float, default=DEFAULT_UTIL, help="vLLM gpu_memory_utilization")
    parser.add_argument("--model-dir", type=Path, default=None, help="where the size's model is made or kept")
    parser.add_argument("--model-timeout", type=float, default=400.0, help="seconds to make the size's model")
    parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler capture")
    parser.add_argument("--cpu", action="store_true", help="CPU dry run of the plumbing (the vLLM stand-in)")
    args = parser.parse_args(argv)
    args.size = args.size or ("cpu" if args.cpu else "large")
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    unknown = [name for name in args.variants if name not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"unknown variant(s) {unknown}: choose from {','.join(VARIANTS)}")
    if args.cpu and SIZES[args.size].get("model") == "large":
        parser.error("the large model is made on a GPU: --cpu takes --size cpu (the default) or seed-cpu")
    return args


class Clock:
    """Seconds since the start, against the budget."""

    def __init__(self, budget_s: float) -> None:
        self.began = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def over(self, expected_s: float = 0.0) -> bool:
        return self.elapsed() + expected_s > self.budget_s


def short_commit() -> str:
    import subprocess

    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def versions() -> dict[str, str]:
    import importlib

    found = {}
    for name in ("torch", "vllm", "trl", "transformers"):
        try:
            found[name] = str(getattr(importlib.import_module(name), "__version__", "stand-in"))
        except Exception as error:  # a version is a note, never a failure
            found[name] = f"not importable ({type(error).__name__})"
    return found


def use_standin(root: Path) -> None:
    """`import vllm` gives the CPU stand-in (tests/support/cpu_vllm.py) in this process: its package written under
    `root` and put first on the path, as the GPU driver's CPU dry run does for its processes."""
    try:
        from support import cpu_vllm
    except ImportError:
        sys.path.insert(0, str(REPO / "tests"))
        from support import cpu_vllm
    sys.path.insert(0, str(cpu_vllm.write_package(root)))


def make_size_model(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The size's model: the bench's random model (made in a child, as bench.grpo makes it, so that this process
    holds no GPU memory from it), else COLOCGRPO_TEST_MODEL, else (a CPU dry run) the tiny model made here."""
    config = SIZES[args.size]
    kind = config.get("model")
    if kind:
        from bench.child_process import run_child
        from bench.grpo.run import child_env

        work = out / "model"
        work.mkdir(parents=True, exist_ok=True)
        folder = args.model_dir or model_dir(kind, args.cpu)
        cmd = [sys.executable, "-m", "bench.grpo", "--out", str(work), "--make-model", "--size", args.size]
        cmd += ["--model-dir", str(folder)] + (["--cpu"] if args.cpu else [])
        code, timed_out = run_child(cmd, child_env(), work, args.model_timeout)
        if code != 0 or not (work / "model.json").exists():
            tail = (work / "stderr.log").read_text(errors="replace")[-2000:]
            raise ProfileError(f"making the {kind} model failed (rc {code}, timed out {timed_out}): {tail}")
        made = json.loads((work / "model.json").read_text())
        return {**made, "kind": kind}
    if Path(MODEL).is_dir():
        return {"kind": "checkpoint", "path": MODEL, "shape": None}
    if not args.cpu:
        raise ProfileError(f"model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)")
    from colocgrpo_dev.models.tiny import build_tiny_model

    return {"kind": "tiny", "path": str(build_tiny_model(out / "tiny-model")), "shape": "tiny"}


def count_params(path: str) -> int:
    """Parameters of the checkpoint's architecture (built on the meta device: nothing allocated or read)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def measure_bandwidth(cpu: bool) -> dict[str, Any]:
    """HBM bandwidth and bf16 rate (`bench.grpo.floor.measure_machine`), its memory handed back before the engine
    is built; on a CPU dry run a host memory copy instead."""
    import torch

    if not cpu:
        from bench.grpo.floor import measure_machine

        machine = measure_machine()
        torch.cuda.empty_cache()
        return {**machine, "bytes_per_s": machine["hbm_bytes_per_s"], "source": "HBM (bench.grpo.floor)"}
    x = torch.empty(64 * 2**20, dtype=torch.uint8)
    y = torch.empty_like(x)
    for _ in range(2):
        y.copy_(x)
    start = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    rate = 2 * x.numel() * 5 / (time.perf_counter() - start)  # read + write, as measure_machine counts
    return {"bytes_per_s": rate, "source": "host memory copy (CPU dry run, not a GPU figure)", "device": "cpu"}


def trainer_sampling(config: dict[str, Any]) -> dict[str, Any]:
    """The trainer's SamplingParams arguments at this size: TRL 1.16's GRPOConfig defaults (the size's temperature
    where it sets one), `logprobs=0` as GRPOTrainer passes it, and `ignore_eos` (every sequence full length)."""
    from trl import GRPOConfig

    from colocgrpo_training.generation.vllm_engine import sampling_base

    defaults = {name: field.default for name, field in GRPOConfig.__dataclass_fields__.items()}
    return sampling_base(
        repetition_penalty=defaults["repetition_penalty"],
        temperature=config.get("temperature", defaults["temperature"]),
        top_p=defaults["top_p"],
        top_k=defaults["top_k"],
        min_p=defaults["min_p"],
        max_tokens=config["max_completion_length"],
        logprobs=0,
        generation_kwargs={"ignore_eos": True},
    )


def trainer_engine_kwargs(model_path: str, config: dict[str, Any], util: float, sequences: int) -> dict[str, Any]:
    """The trainer's LLM arguments for a one-GPU job at this size: `engine_kwargs` with the trainer config's
    defaults (VLLMSettings' prefix caching, GRPOConfig's model implementation and remote-code switch), TRL's
    max_num_seqs (per-device batch x TP x steps per generation: the batch) and the engine seed of rank 0."""
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation.tp_groups import engine_seed
    from colocgrpo_training.generation.vllm_engine import engine_kwargs

    settings = VLLMSettings(
        tensor_parallel_size=1, gpu_memory_utilization=util, max_model_len=config["max_model_len"], sleep_policy="auto"
    )
    defaults = {name: field.default for name, field in GRPOConfig.__dataclass_fields__.items()}
    return engine_kwargs(
        model_path,
        tensor_parallel_size=1,
        gpu_memory_utilization=util,
        max_model_len=config["max_model_len"],
        max_num_seqs=sequences,
        enable_sleep_mode=True,
        enable_prefix_caching=settings.enable_prefix_caching,
        model_impl=defaults["vllm_model_impl"],
        seed=engine_seed(config["seed"], 0, 1),
        trust_remote_code=defaults["trust_remote_code"],
    )


def output_facts(outputs: list[Any]) -> dict[str, Any]:
    """What a generate returned: tokens in all and per sequence, and whether token ids, log-probs and text came."""
    completions = [c for o in outputs for c in o.outputs]
    lengths = [len(c.token_ids) for c in completions]
    texts = [getattr(c, "text", None) for c in completions]
    return {
        "sequences": len(completions),
        "tokens": sum(lengths),
        "tokens_per_sequence": statistics.median(lengths) if lengths else 0,
        "tokens_per_sequence_min": min(lengths, default=0),
        "tokens_per_sequence_max": max(lengths, default=0),
        "token_ids_returned": bool(lengths) and all(n > 0 for n in lengths),
        "logprobs_returned": bool(completions) and all(c.logprobs is not None for c in completions),
        "text_chars": None if any(t is None for t in texts) else sum(len(t) for t in texts),
    }


class Engine:
    """The engine and what every timed generate needs around it."""

    def __init__(self, llm: Any, sampling_cls: Any, batch: list[list[int]], cuda: bool) -> None:
        self.llm = llm
        self.sampling_cls = sampling_cls
        self.prompts = [{"prompt_token_ids": ids} for ids in batch]  # as ColocatedVLLM.generate passes them
        self.cuda = cuda

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def generate(self, sampling: dict[str, Any]) -> tuple[float, list[Any]]:
        """One generate of the batch after a prefix-cache reset (untimed), as the trainer generates after a push or
        wake; its wall seconds and outputs."""
        params = self.sampling_cls(**sampling)
        self.llm.reset_prefix_cache()
        self.sync()
        start = time.perf_counter()
        outputs = self.llm.generate(self.prompts, sampling_params=params, use_tqdm=False)
        self.sync()
        return time.perf_counter() - start, outputs

    def sleep_and_wake(self) -> tuple[float, float]:
        """A level-1 sleep, then the wake as the controller orders it (weights, KV cache); seconds of each."""
        self.sync()
        start = time.perf_counter()
        self.llm.sleep(level=1)
        self.sync()
        slept = time.perf_counter()
        if self.cuda:
            import torch

            torch.cuda.empty_cache()  # as ColocatedVLLM.wake_weights
        self.llm.wake_up(tags=["weights"])
        self.llm.wake_up(tags=["kv_cache"])
        self.sync()
        return slept - start, time.perf_counter() - slept


def run_variant(engine: Engine, name: str, base: dict[str, Any], reps: int) -> dict[str, Any]:
    sampling = variant_sampling(name, base)
    engine.generate(sampling)  # warm-up
    if name != "after-wake":
        timed = [engine.generate(sampling) for _ in range(reps)]
        result = timing_summary([seconds for seconds, _ in timed])
        return {**result, **output_facts(timed[-1][1]), "sampling": sampling}
    first, later, sleeps, wakes = [], [], [], []
    outputs: list[Any] = []
    for _ in range(reps):
        slept, woke = engine.sleep_and_wake()
        sleeps.append(slept)
        wakes.append(woke)
        first.append(engine.generate(sampling)[0])
        seconds, outputs = engine.generate(sampling)
        later.append(seconds)
    return {
        **timing_summary(first),
        **output_facts(outputs),
        "later": timing_summary(later),
        "sleep_s": timing_summary(sleeps),
        "wake_s": timing_summary(wakes),
        "sampling": sampling,
    }


def profile_generate(engine: Engine, base: dict[str, Any], out: Path, unprofiled_s: float | None) -> dict[str, Any]:
    """One `trainer` generate under torch.profiler: the GPU's busy time against the wall time, and the op tables."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.cuda else [])
    with profile(activities=activities, post_processing_timeout_s=POST_PROCESSING_S) as prof:
        wall, _ = engine.generate(variant_sampling("trainer", base))
    started = time.perf_counter()
    events = prof.events()
    device = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    averages = prof.key_averages()
    tables = []
    for key in ("self_cpu_time_total", "self_device_time_total" if engine.cuda else None):
        if key:
            table = averages.table(sort_by=key, row_limit=TOP_OPS, max_name_column_width=70)
            tables.append(f"== top {TOP_OPS} ops by {key} (one trainer generate, {wall:.3f} s wall)\n{table}\n")
    (out / OPS_NAME).write_text("\n".join(tables))
    result: dict[str, Any] = {
        "status": "measured",
        "wall_s": wall,
        "events": len(events),
        "device_events": len(device),
        "ops_file": OPS_NAME,
        "post_processing_s": time.perf_counter() - started,
    }
    if result["post_processing_s"] >= POST_PROCESSING_S:
        result["note"] = f"the profiler's post-processing stopped at {POST_PROCESSING_S} s: events are missing"
    if engine.cuda:
        busy = interval_union(device) / 1e6
        result.update(
            gpu_busy_s=busy,
            device_sum_s=sum(b - a for a, b in device) / 1e6,
            gpu_busy_fraction=busy / wall,
            gpu_busy_fraction_of_unprofiled=busy / unprofiled_s if unprofiled_s else None,
        )
    return result


def run_steps(
    steps: list[str],
    measure: Callable[[str], dict[str, Any]],
    clock: Clock,
    report: dict[str, Any],
    write: Callable[[], Any],
) -> bool:
    """Each step in order, a variant or `profile` (`measure` gives its result), into `report`, written after each:
    one that would end past the budget is skipped, one that raises is recorded with its error and the next still
    runs. True when every step was measured."""
    last_wall = 0.0
    complete = True
    for name in steps:
        if name != "profile":
            report["order"].append(name)
        # The next step's time, guessed from the last one's; after-wake times twice as many generates, and sleeps.
        if clock.over(last_wall * (3 if name == "after-wake" else 1)):
            note = f"skipped (time budget: {clock.elapsed():.0f} s used of {clock.budget_s:.0f})"
            complete = False
            entry: dict[str, Any] = {"status": note}
            print(f"[gen-profile] {name}: {note}", flush=True)
        else:
            began = clock.elapsed()
            try:
                entry = measure(name)
            except Exception as error:  # recorded; the other steps still run
                complete = False
                entry = {
                    "status": f"failed: {type(error).__name__}: {error}"[:300],
                    "error": traceback.format_exc()[-3000:],
                }
                print(f"[gen-profile] {name} FAILED:\n{entry['error']}", flush=True)
            last_wall = clock.elapsed() - began
            entry["step_wall_s"] = last_wall
            median = entry.get("median_s")
            print(
                f"[gen-profile] {name}: {last_wall:.1f} s" + (f", median {median:.3f} s" if median else ""), flush=True
            )
        if name == "profile":
            report["profile"] = entry
        else:
            report["variants"][name] = entry
        report["differences"] = differences(report["variants"])
        write()
    return complete


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.budget_seconds)
    config = SIZES[args.size]
    report: dict[str, Any] = {
        "size": args.size,
        "cpu_dry_run": args.cpu,
        "reps": args.reps,
        "budget_seconds": args.budget_seconds,
        "order": [],
        "variants": {},
        "notes": [],
        "commit": short_commit(),
    }

    def write() -> list[str]:
        report["elapsed_s"] = clock.elapsed()
        (out / JSON_NAME).write_text(json.dumps(report, indent=2, default=str))
        lines = render_markdown(report)
        (out / MD_NAME).write_text("\n".join(lines) + "\n")
        return lines

    try:
        status = profile_run(args, out, config, report, clock, write)
    except Exception as error:  # whatever stopped it goes into the report, then the exit status says so
        report["error"] = str(error) if isinstance(error, ProfileError) else traceback.format_exc()[-3000:]
        print(f"[gen-profile] STOPPED: {report['error']}", file=sys.stderr, flush=True)
        status = 2
    print("\n".join(write()), flush=True)
    return status


def profile_run(
    args: argparse.Namespace,
    out: Path,
    config: dict[str, Any],
    report: dict[str, Any],
    clock: Clock,
    write: Callable[[], list[str]],
) -> int:
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # as the GPU driver runs vLLM (not carried there)
    report["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}
    if args.cpu:
        use_standin(out / "standin")
    else:
        import torch

        if not torch.cuda.is_available():
            raise ProfileError("no CUDA device (--cpu runs the plumbing on CPU with the vLLM stand-in)")
    model = make_size_model(args, out)
    model["params"] = model.get("params") or count_params(model["path"])
    report["model"] = model
    print(
        f"[gen-profile] model {model['kind']}, shape {model.get('shape')}: {model['params']:,} parameters", flush=True
    )

    import torch
    from transformers import AutoTokenizer
    from trl.trainer.utils import ensure_master_addr_port

    from bench.grpo.prompts import exact_rows, generation_batch, question_rows
    from bench.grpo.report import host_info
    from bench.grpo.worker import EXACT_ROWS

    cuda = not args.cpu
    report["host"] = host_info()
    report["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    machine = measure_bandwidth(args.cpu)
    report["machine"] = machine
    floor = decode_floor(model["params"], machine["bytes_per_s"], config["max_completion_length"])
    report["floor"] = floor

    tokenizer = AutoTokenizer.from_pretrained(model["path"])
    rows = (
        exact_rows(tokenizer, config["prompt_tokens"], EXACT_ROWS) if config.get("exact_prompts") else question_rows()
    )
    batch = generation_batch(tokenizer, rows, config)
    lengths = [len(ids) for ids in batch]
    report["batch"] = {
        "sequences": len(batch),
        "prompts": len(batch) // config["num_generations"],
        "num_generations": config["num_generations"],
        "completion_tokens": config["max_completion_length"],
        "prompt_tokens_min": min(lengths),
        "prompt_tokens_max": max(lengths),
        "prompt_tokens_mean": statistics.mean(lengths),
    }
    base = trainer_sampling(config)
    report["sampling"] = base
    report["notes"].append(
        "ignore_eos=True in every variant: every sequence decodes exactly max_tokens (the large size's trainer "
        "config does not set it; a random model seldom samples the end-of-sequence token)"
    )
    kwargs = trainer_engine_kwargs(model["path"], config, args.util, len(batch))
    report["engine"] = {**kwargs, "gpu_memory_utilization_note": "fixed for a generate-only profile (--util)"}
    write()

    # external_launcher: vLLM runs in this process and reads the launcher's variables (as ColocatedVLLM sets them).
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    ensure_master_addr_port()
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as error:
        raise ProfileError(f"building the engine failed: {error!r}\n{traceback.format_exc()[-3000:]}") from error
    report["engine"]["build_s"] = time.perf_counter() - start
    report["versions"] = versions()
    print(f"[gen-profile] engine built in {report['engine']['build_s']:.1f} s", flush=True)
    engine = Engine(llm, SamplingParams, batch, cuda)

    steps: list[str] = list(args.variants)
    if not args.no_profile:
        steps.insert(steps.index("trainer") + 1 if "trainer" in steps else 0, "profile")

    def measure(name: str) -> dict[str, Any]:
        if name == "profile":
            return profile_generate(engine, base, out, report["variants"].get("trainer", {}).get("median_s"))
        return {"status": "measured", **with_floor(run_variant(engine, name, base, args.reps), floor)}

    complete = run_steps(steps, measure, clock, report, write)
    return 0 if complete else 1


if __name__ == "__main__":
    from colocgrpo_training.entrypoint import exit_process

    # vLLM's engine holds a process group: leave without the interpreter's finalization, as the trainer does.
    exit_process(main())
