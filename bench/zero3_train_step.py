"""The training side alone: one optimizer step of the large size under ZeRO-3, per DeepSpeed file.

    python3 -m bench.zero3_train_step --model DIR --out DIR [--files plain,product,...]

bench/grpo_step.py showed that at 7.18B most of a GRPO step is the training side, and its
profile that the GPU is busy for only about a third of a train-only step: the rest is
ZeRO-3's Python machinery on the CPU. This isolates that part, without vLLM or TRL, so
each DeepSpeed setting costs ~1 minute to measure instead of a whole GRPO run. One step is
`gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows ×
(prompt + completion) tokens (grpo_step.py's `large` size), forward + backward with
gradient checkpointing (non-reentrant, as TRL does), then fused AdamW (the HF Trainer's
default). Each file runs in its own process; the report gives the median seconds per
optimizer step and the ratio to the first file.

Files (`FILES`): `plain` is ZeRO-3 with DeepSpeed's defaults (what TRL's docs give);
`auto` is the operator's render for a multi-GPU job, with transformers' "auto" values
filled in as transformers fills them (what one-GPU jobs got before the one-GPU render);
`persist` and `persist-nomel` add one one-GPU knob at a time; `product` is what the
operator renders for a one-GPU job now.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.child_process import install_stop_handlers, run_child
from bench.grpo_step import PROMPT_TOKENS, SIZES

REPO = Path(__file__).resolve().parents[1]


def zero_sections(hidden: int) -> dict[str, dict]:
    """The ZeRO sections compared, "auto" values resolved the way transformers resolves them."""
    from colocgrpo_operator.render.launch_config import EVERY_PARAMETER, one_gpu_zero3

    auto = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
        "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000,
    }
    persist = {"stage": 3, "stage3_param_persistence_threshold": EVERY_PARAMETER}
    return {
        "plain": {"stage": 3},
        "auto": auto,
        "persist": persist,
        "persist-nomel": {**persist, "memory_efficient_linear": False},
        "product": {**auto, **one_gpu_zero3()},
    }


FILES = ("plain", "auto", "persist", "persist-nomel", "product")


def worker(name: str, model_dir: str, out: Path, warmup: int, measured: int) -> None:
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    size = SIZES["large"]
    hidden = AutoConfig.from_pretrained(model_dir).hidden_size
    rows, accumulation = size["per_device_train_batch_size"], size["gradient_accumulation_steps"]
    config = {
        "zero_optimization": zero_sections(hidden)[name],
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": rows,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000,
    }
    deepspeed.init_distributed(dist_backend="nccl")
    keep = HfDeepSpeedConfig(config)  # noqa: F841 - from_pretrained builds under zero.Init while it lives
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=size["learning_rate"], fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    tokens = PROMPT_TOKENS + size["max_completion_length"]
    generator = torch.Generator(device=engine.device).manual_seed(size["seed"])
    times = []
    for _ in range(warmup + measured):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(accumulation):
            ids = torch.randint(0, model.config.vocab_size, (rows, tokens), device=engine.device, generator=generator)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = {
        "file": name,
        "zero_optimization": config["zero_optimization"],
        "step_times": times,
        "median_s_per_step": statistics.median(times[warmup:]),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "persistent_parameters": sum(bool(getattr(p, "ds_persist", False)) for p in engine.module.parameters()),
        "parameters": sum(1 for _ in engine.module.parameters()),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a model folder (grpo_step.py --size large makes one)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--measured-steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="per file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n for n in args.files.split(",") if n]
    unknown = sorted(set(names) - set(FILES))
    if unknown:
        parser.error(f"unknown --files {unknown}: choose from {', '.join(FILES)}")
    out = args.out.resolve()
    if args.worker:
        worker(args.worker, args.model, out, args.warmup_steps, args.measured_steps)
        return 0
    install_stop_handlers()
    env = dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29533",
        PYTHONPATH=f"{REPO}:{REPO / 'operator'}:{REPO / 'training'}:{os.environ.get('PYTHONPATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    results = []
    for name in names:
        work = out / name
        work.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "bench.zero3_train_step",
            "--worker",
            name,
            "--model",
            args.model,
            "--out",
            str(work),
            "--warmup-steps",
            str(args.warmup_steps),
            "--measured-steps",
            str(args.measured_steps),
        ]
        code, timed_out = run_child(cmd, env, work, args.timeout)
        if code == 0 and (work / "result.json").exists():
            results.append(json.loads((work / "result.json").read_text()))
        else:
            tail = (work / "stderr.log").read_text(errors="replace")[-1500:]
            results.append({"file": name, "status": "timed out" if timed_out else f"failed (rc {code})", "error": tail})
        print(f"[zero3] {name}: {results[-1].get('median_s_per_step', results[-1].get('status'))}", flush=True)
    base = next((r["median_s_per_step"] for r in results if "median_s_per_step" in r), None)
    lines = [
        "| DeepSpeed file | median s/step | ÷ first | steps (s) | persistent params | peak allocated GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if "median_s_per_step" not in r:
            lines.append(f"| {r['file']} | {r['status']} | | | | |")
            continue
        lines.append(
            f"| {r['file']} | {r['median_s_per_step']:.3f} | {r['median_s_per_step'] / base:.2f} | "
            f"{', '.join(f'{t:.2f}' for t in r['step_times'])} | {r['persistent_parameters']}/{r['parameters']} | "
            f"{r['peak_allocated_bytes'] / 2**30:.1f} |"
        )
    (out / "zero3.json").write_text(json.dumps(results, indent=2))
    (out / "zero3.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all("median_s_per_step" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
