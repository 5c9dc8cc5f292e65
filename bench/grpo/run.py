"""The parent of a run: its arguments, the machine measurement and model in child processes, each
contender's launch down the utilization ladder, and the report after every contender."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.child_process import install_stop_handlers, run_child
from bench.grpo.contenders import (
    DEFAULT_CONTENDERS,
    DEFAULT_LARGE_CONTENDERS,
    DEFAULT_SEED_CONTENDERS,
    PLAIN_DEEPSPEED,
    check_contender,
    deepspeed_file_key,
    ours_utilization,
    pair_order,
    product_deepspeed,
)
from bench.grpo.floor import measure_machine
from bench.grpo.model import make_model, model_dir
from bench.grpo.report import host_info, incomplete, write_report
from bench.grpo.sizes import CONTENDER_TIMEOUT_S, MODEL, SIZES, util_ladder
from bench.grpo.vllm_counters import logged_kv_cache_tokens
from bench.grpo.worker import worker

REPO = Path(__file__).resolve().parents[2]


OOM_MARKERS = ("out of memory", "outofmemoryerror", "no available memory for the cache blocks", "free memory on device")


def ran_out_of_memory(work: Path) -> bool:
    text = ""
    for name in ("stderr.log", "stdout.log"):
        if (work / name).exists():
            text += (work / name).read_text(errors="replace")[-200_000:].lower()
    return any(marker in text for marker in OOM_MARKERS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--contenders",
        default=None,
        type=lambda v: [check_contender(c) for c in v.split(",") if c],
        help=f"default: {DEFAULT_CONTENDERS} (small), {DEFAULT_LARGE_CONTENDERS} (large), "
        f"{DEFAULT_SEED_CONTENDERS} (seed)",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="where the size's model is made (default: /tmp/models/random-large, /tmp/models/random-seed)",
    )
    parser.add_argument(
        "--util-ladder",
        default=None,
        help="large and seed sizes: utilizations to try, highest first, for every contender (default: what the "
        "training state leaves, ours at the seed size from the memory plan)",
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
    parser.add_argument(
        "--contender-timeout", type=float, default=None, help="seconds per contender (default: the size's, 200 or 330)"
    )
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
        defaults = {"small": DEFAULT_CONTENDERS, "seed": DEFAULT_SEED_CONTENDERS, "seed-cpu": DEFAULT_SEED_CONTENDERS}
        args.contenders = defaults.get(args.size, DEFAULT_LARGE_CONTENDERS).split(",")
    if args.contender_timeout is None:
        args.contender_timeout = float(config.get("contender_timeout_s", CONTENDER_TIMEOUT_S))
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
    """The parent of a run, or (hidden flags) one of its children: a contender's rank (`--worker`), the
    machine measurement (`--measure-machine`), the large model (`--make-model`)."""
    args = parse_args(argv)
    out = args.out.resolve()
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
            profile_steps=tuple(int(n) for n in args.profile_steps.split(",") if n),
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
        kind = SIZES[args.size].get("model", "large")
        made = make_model(kind, args.model_dir or model_dir(kind, args.cpu), MODEL, cpu=args.cpu)
        (out / "model.json").write_text(json.dumps(made))
        return 0
    return run_contenders(args, out)


def child_env() -> dict[str, str]:
    """The environment of every child: this checkout's code first."""
    return dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}",
        VLLM_USE_FLASHINFER_SAMPLER="0",
        PYTHONUNBUFFERED="1",
    )


def measure_in_child(out: Path, env: dict[str, str]) -> dict:
    """The machine's rates, in a process of its own so that the parent holds no GPU memory while the
    contenders run."""
    code, timed_out = run_child(
        [sys.executable, "-m", "bench.grpo", "--out", str(out), "--measure-machine"], env, out, 120
    )
    if code == 0 and (out / "machine.json").exists():
        return json.loads((out / "machine.json").read_text())
    return {"error": f"machine measurement failed (rc {code}, timed out {timed_out})"}


def size_model(
    args: argparse.Namespace, out: Path, env: dict[str, str], machine: dict
) -> tuple[dict, list[float | None]] | None:
    """The size's model, made (or found) in a child, and the utilizations to try, highest first ([None]: the
    size's own); None (after saying why) when either cannot be had."""
    config = SIZES[args.size]
    kind = config["model"]
    folder = args.model_dir or model_dir(kind, args.cpu)
    cmd = [sys.executable, "-m", "bench.grpo", "--out", str(out), "--make-model", "--size", args.size]
    cmd += ["--model-dir", str(folder)] + (["--cpu"] if args.cpu else [])
    code, timed_out = run_child(cmd, env, out, 400)
    if code != 0 or not (out / "model.json").exists():
        print(
            f"[bench] making the {kind} model failed (rc {code}, timed out {timed_out}):\n"
            + (out / "stderr.log").read_text(errors="replace")[-3000:],
            file=sys.stderr,
        )
        return None
    model_info = json.loads((out / "model.json").read_text())
    print(
        f"[bench] {kind} model: {model_info['shape']}, {model_info['params'] / 1e9:.2f}B parameters "
        f"at {model_info['path']}",
        flush=True,
    )
    ladder: list[float | None]
    if config["gpu_memory_utilization"] is not None:
        ladder = [None]
    elif args.util_ladder:
        ladder = [float(u) for u in args.util_ladder.split(",") if u]
    elif "total_bytes" in machine:
        ladder = list(util_ladder(machine["total_bytes"], model_info["params"]))
    else:
        print(
            f"[bench] no device memory size to plan utilizations from ({machine}); pass --util-ladder",
            file=sys.stderr,
        )
        return None
    model_info["util_ladder"] = ladder
    return model_info, ladder


def contender_ladders(
    args: argparse.Namespace, model_info: dict, machine: dict, ladder: list[float | None]
) -> dict[str, list[float | None]]:
    """Each contender's utilizations, highest first. At the seed size (unless --util-ladder) ours starts at the
    memory plan's recommendation for its job, then the ladder below it; every other contender, and every one at
    the other sizes, takes the ladder: the highest utilization that fits beside its training state first."""
    ladders = {}
    for contender in args.contenders:
        planned = None
        if SIZES[args.size].get("model") == "seed" and not args.util_ladder and "total_bytes" in machine:
            planned = ours_utilization(
                contender, SIZES[args.size], model_info["path"], machine["total_bytes"], args.num_processes, args.tp
            )
        below = [u for u in ladder if u is not None and planned is not None and u < planned]
        ladders[contender] = ladder if planned is None else [planned, *below]
    return ladders


def write_deepspeed_files(args: argparse.Namespace, out: Path, model_dir: str) -> dict[str, Path]:
    """Every DeepSpeed file a contender may train under, written into the run's folder, by key; the operator's
    renders sized for the model in `model_dir`."""
    files = {}
    shaped = {"gpus": args.num_processes, "tensor_parallel_size": args.tp, "model_dir": model_dir}
    for choice, config in (
        ("plain", PLAIN_DEEPSPEED),
        ("product", product_deepspeed(**shaped)),
        ("product-offload", product_deepspeed(offload_trainer_state=True, **shaped)),
    ):
        files[choice] = out / f"deepspeed-{choice}.json"
        files[choice].write_text(json.dumps(config, indent=2))
    return files


def contender_command(
    args: argparse.Namespace,
    contender: str,
    work: Path,
    model_path: str,
    deepspeed_files: dict[str, Path],
    util: float | None,
) -> list[str]:
    """The `accelerate launch` of one contender at one utilization: its DeepSpeed file (or none) and the
    run's settings passed on to every rank."""
    key = deepspeed_file_key(contender)
    launcher = (
        []  # plain accelerate: no DeepSpeed
        if key == "none"
        else ["--use_deepspeed", "--deepspeed_config_file", str(deepspeed_files[key]), "--zero3_init_flag", "true"]
    )
    return (
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
            "bench.grpo",
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
            model_path,
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


def run_contenders(args: argparse.Namespace, out: Path) -> int:
    """The run: the machine's rates and the model, then each contender in order, down the utilization
    ladder where it runs out of memory, until the time budget; the report after each. 0 when every
    contender was measured."""
    install_stop_handlers()
    if not Path(MODEL).exists():
        print(f"[bench] model not found at {MODEL} (set COLOCGRPO_TEST_MODEL)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    env = child_env()
    machine: dict = {} if args.cpu else measure_in_child(out, env)
    model_info: dict = {"path": MODEL}
    ladder: list[float | None] = [None]  # the size's fixed utilization
    if "model" in SIZES[args.size]:
        made = size_model(args, out, env, machine)
        if made is None:
            return 2
        model_info, ladder = made
    ladders = contender_ladders(args, model_info, machine, ladder)
    model_info["utilizations"] = ladders
    deepspeed_files = write_deepspeed_files(args, out, model_info["path"])
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
        for util in ladders[contender]:
            elapsed = time.perf_counter() - began
            if elapsed + last_wall > args.budget_seconds:
                result = {"contender": contender, "status": "skipped (time budget)"}
                print(f"[bench] {contender}: skipped, {elapsed:.0f} s used of {args.budget_seconds:.0f}", flush=True)
                break
            work = out / (contender if util is None else f"{contender}-util{util}")
            work.mkdir(parents=True, exist_ok=True)
            cmd = contender_command(args, contender, work, model_info["path"], deepspeed_files, util)
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
                result["kv_cache_tokens_logged"] = logged_kv_cache_tokens(work)
                if result.get("kv_cache_tokens") is None:
                    result["kv_cache_tokens"] = result["kv_cache_tokens_logged"]
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
