"""The training side alone: one optimizer step of the large size under ZeRO-3, per DeepSpeed file.

    python3 -m bench.zero3_train_step --model DIR --out DIR [--files plain,product,...]

bench/grpo/ (the GRPO step benchmark) showed that at 7.18B most of a GRPO step is the training side, and its
profile that the GPU is busy for only about a third of a train-only step: the rest is
ZeRO-3's Python machinery on the CPU. This isolates that part, without vLLM or TRL, so
each DeepSpeed setting costs ~1 minute to measure instead of a whole GRPO run. One step is
`gradient_accumulation_steps` micro-batches of `per_device_train_batch_size` rows ×
(prompt + completion) tokens (bench/grpo's `large` size), forward + backward with
gradient checkpointing (non-reentrant, as TRL does), then fused AdamW (the HF Trainer's
default). Each file runs in its own process; the report gives the median seconds per
optimizer step and the ratio to the first file.

Files (`FILES`): `plain` is ZeRO-3 with DeepSpeed's defaults (what TRL's docs give);
`auto` is transformers' "auto" values filled in as transformers fills them (what every job
got before the planner sized the knobs); `planned` is what the operator renders for a
multi-GPU job (the planner's knobs, colocgrpo_training/planner/zero3.py); `persist` and
`persist-nomel` add one one-GPU knob at a time; `product` is what the operator renders for
a one-GPU job.

    python3 -m bench.zero3_train_step --model DIR --out DIR --variants all [--file product]

`--variants` measures training-side candidates against a baseline in ONE process (the model is
loaded once, under `--file`): the step as GRPO runs it — TRL 1.16's chunked log-prob LM head
(`add_fused_lm_head`, no full logits), the GRPO/DAPO token loss normalised by the optimizer step's
completion tokens, then the optimizer — and the no-grad old-log-prob forward of one generation.
`VARIANTS` lists them. The learning rate is 0 by default, so every variant's steps see the same
weights and the same rows: the loss and gradient norm of equal steps must agree across variants
(the table shows them), which checks the candidates compute the same step as the baseline.
`--cpu` runs the matrix on the CPU (gloo, float32; a tiny model) as a dry run of the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.child_process import install_stop_handlers, run_child
from bench.grpo.sizes import PROMPT_TOKENS, SIZES
from colocgrpo_training.planner.shapes import ModelShape, shape_from_config
from colocgrpo_training.planner.zero3 import EVERY_PARAMETER, zero3_knobs

REPO = Path(__file__).resolve().parents[1]
# The checkout's packages for a child's PYTHONPATH (the venvs have none of them installed).
CHECKOUT_PATH = os.pathsep.join(str(REPO / part) for part in ("", "operator", "training", "dev"))


def zero_sections(shape: ModelShape) -> dict[str, dict]:
    """The ZeRO sections compared, for a model of `shape`; "auto" values resolved the way transformers resolves
    them, the operator's knobs as the planner sizes them (colocgrpo_training.planner.zero3)."""
    h = shape.hidden_size
    rendered = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "stage3_max_live_parameters": 1_000_000_000,
        "stage3_max_reuse_distance": 1_000_000_000,
    }

    def operator(world_size: int) -> dict[str, Any]:
        knobs = zero3_knobs(shape, world_size=world_size, offload_parameters=False, offload_trainer_state=False)
        return {**rendered, **knobs.section()}

    auto = {
        **rendered,
        "reduce_bucket_size": h * h,
        "stage3_prefetch_bucket_size": int(0.9 * h * h),
        "stage3_param_persistence_threshold": 10 * h,
    }
    persist = {"stage": 3, "stage3_param_persistence_threshold": EVERY_PARAMETER}
    return {
        "plain": {"stage": 3},
        "auto": auto,
        "planned": operator(world_size=2),
        "persist": persist,
        "persist-nomel": {**persist, "memory_efficient_linear": False},
        "product": operator(world_size=1),
    }


def model_shape(model_dir: str) -> ModelShape:
    """The planner's shape of the model in `model_dir` (its config.json)."""
    return shape_from_config(Path(model_dir) / "config.json")


FILES = ("plain", "auto", "planned", "persist", "persist-nomel", "product")


def training_file(section: dict[str, Any], rows: int, accumulation: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed file these benchmarks train under: `section` as its zero_optimization, `rows` per micro-batch,
    `accumulation` micro-batches per optimizer step, clipping at 1.0."""
    return {
        "zero_optimization": section,
        "bf16": {"enabled": bf16},
        "train_micro_batch_size_per_gpu": rows,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000,
    }


def load_for_zero3(model_dir: str, config: dict[str, Any], cpu: bool) -> tuple[Any, Any]:
    """Join the process group (gloo on the CPU, else NCCL) and load the model as ZeRO-3 partitions of `config`, in
    float32 on the CPU, else bfloat16. Returns the model and transformers' DeepSpeed config object, which must live as
    long as the model is trained (transformers asks it whether ZeRO-3 is on)."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl")
    keep = HfDeepSpeedConfig(config)  # from_pretrained builds under zero.Init while it lives
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32 if cpu else torch.bfloat16)
    model.config.use_cache = False
    return model, keep


def worker(name: str, model_dir: str, out: Path, warmup: int, measured: int) -> None:
    import deepspeed
    import torch

    size = SIZES["large"]
    rows, accumulation = size["per_device_train_batch_size"], size["gradient_accumulation_steps"]
    config = training_file(zero_sections(model_shape(model_dir))[name], rows, accumulation, bf16=True)
    model, _ds_config = load_for_zero3(model_dir, config, cpu=False)  # _ds_config lives while the model trains
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=size["learning_rate"], fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    engine.train()  # from_pretrained returns the model in eval mode, where checkpointing is skipped
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


# ---------------------------------------------------------------- the variant matrix (one process)
# name: (what it measures, rows per micro-batch — None: the size's —, gradient checkpointing: True, False, or an int k
# for the first k decoder layers only, as ColocGRPOTrainer(checkpointed_layers=k) runs it). Train
# variants run a whole optimizer step (the size's rows per step, split into micro-batches of that many
# rows); `oldlogp-*` run the no-grad forward of one generation's rows in chunks of that many rows
# (-1: as many as ColocGRPOTrainer's default no-grad token budget gives).
VARIANTS: dict[str, tuple[str, int | None, bool | int]] = {
    "oldlogp-16": ("oldlogp", None, False),  # TRL: one chunk per micro-batch (per_device_train_batch_size)
    "oldlogp-auto": ("oldlogp", -1, False),  # ColocGRPOTrainer's default (`no_grad_rows`)
    "oldlogp-128": ("oldlogp", 128, False),  # one chunk for the whole generation
    "base": ("train", None, True),  # TRL's step: 4 micro-batches of 16, non-reentrant checkpointing
    "mb32": ("train", 32, True),  # the same 64 rows in 2 micro-batches
    "mb64": ("train", 64, True),  # ... in 1 micro-batch
    "base-again": ("train", None, True),  # the baseline repeated: the drift within the run
    "no-ckpt": ("train", None, False),  # 4 x 16 without checkpointing
    # 1 x 64 with the first 17 of 32 layers checkpointed, the planner's choice at 7.18B on an H200 (the most memory:
    # last)
    "mb64-first17": ("train", 64, 17),
}


def variant_rows(size: dict) -> tuple[int, int]:
    """Rows per optimizer step and rows per generation of the size."""
    micro = size["per_device_train_batch_size"]
    return micro * size["gradient_accumulation_steps"], micro * size["steps_per_generation"]


def step_batch(step: int, rows: int, tokens: int, vocab: int, seed: int, device) -> tuple:
    """The rows of optimizer step `step` (the same for every variant): token ids, and one advantage per row."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1000 + step)
    ids = torch.randint(0, vocab, (rows, tokens), generator=generator)
    advantages = torch.randn(rows, generator=generator)
    return ids.to(device), advantages.to(device)


def grpo_token_loss(engine, ids, advantages, prompt_tokens: int, normalizer: float):
    """GRPO's per-token loss as TRL 1.16 computes it at beta 0 with one iteration (ratio 1, DAPO
    normalisation): -exp(logp - logp.detach()) * advantage, summed over the completion tokens and
    divided by the optimizer step's completion tokens, through TRL's chunked log-prob head."""
    import torch

    labels = ids.clone()
    labels[:, :prompt_tokens] = -100
    out = engine(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
    logps = out.log_probs
    mask = out.label_mask.to(logps.dtype)
    per_token = -torch.exp(logps - logps.detach()) * advantages.unsqueeze(1)
    return (per_token * mask).sum() / normalizer


def variants_worker(
    names: list[str], model_dir: str, out: Path, warmup: int, measured: int, file: str, cpu: bool, lr: float
) -> None:
    import deepspeed
    import torch
    from trl.trainer.utils import add_fused_lm_head

    size = SIZES["large"]
    micro = size["per_device_train_batch_size"]
    step_rows, generation_rows = variant_rows(size)
    sections = zero_sections(model_shape(model_dir))
    config = training_file(sections[file], micro, size["gradient_accumulation_steps"], bf16=not cpu)
    model, _ds_config = load_for_zero3(model_dir, config, cpu)  # _ds_config lives while the model trains
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=not cpu)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    # from_pretrained returns the model in eval mode, and transformers' decoder layers checkpoint only in
    # training mode (GradientCheckpointingLayer): without this the "on" rows ran without checkpointing.
    engine.train()
    tokens = PROMPT_TOKENS + size["max_completion_length"]
    vocab = model.config.vocab_size

    def sync() -> None:
        if not cpu:
            torch.cuda.synchronize()

    def set_checkpointing(value: bool | int) -> None:
        from colocgrpo_training.generation.checkpointing import checkpoint_first_layers

        engine.module.gradient_checkpointing_disable()
        if value is False:
            return
        engine.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if value is not True:
            checkpoint_first_layers(engine.module, value)

    results: list[dict] = []

    def save() -> None:
        (out / "result.json").write_text(json.dumps({"file": file, "lr": lr, "variants": results}, indent=2))

    for name in names:
        kind, rows, checkpointing = VARIANTS[name]
        if rows == -1:
            from colocgrpo_training.generation.trainer import DEFAULT_NO_GRAD_TOKENS, no_grad_rows

            rows = no_grad_rows(micro, tokens, DEFAULT_NO_GRAD_TOKENS)
        rows = rows or micro
        record: dict = {"variant": name, "kind": kind, "rows_per_chunk": rows, "gradient_checkpointing": checkpointing}
        record["training_mode"] = engine.module.training  # checkpointing takes effect only in training mode
        if not cpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        times, losses, grad_norms = [], [], []
        try:
            set_checkpointing(checkpointing)
            for step in range(warmup + measured):
                if kind == "oldlogp":
                    ids, _ = step_batch(step, generation_rows, tokens, vocab, size["seed"], engine.device)
                    labels = ids.clone()
                    labels[:, :PROMPT_TOKENS] = -100
                    sync()
                    start = time.perf_counter()
                    with torch.no_grad():
                        chunks = [
                            engine(
                                input_ids=ids[i : i + rows],
                                attention_mask=torch.ones_like(ids[i : i + rows]),
                                labels=labels[i : i + rows],
                                fused_lm_head=True,
                            ).log_probs
                            for i in range(0, generation_rows, rows)
                        ]
                        logps = torch.cat(chunks)
                    sync()
                    times.append(time.perf_counter() - start)
                    losses.append(float(logps.double().sum()))
                    continue
                ids, advantages = step_batch(step, step_rows, tokens, vocab, size["seed"], engine.device)
                completion_tokens = float(step_rows * (tokens - PROMPT_TOKENS))
                sync()
                start = time.perf_counter()
                total = 0.0
                starts = range(0, step_rows, rows)
                for i in starts:
                    engine.set_gradient_accumulation_boundary(i == starts[-1])
                    loss = grpo_token_loss(
                        engine, ids[i : i + rows], advantages[i : i + rows], PROMPT_TOKENS, completion_tokens
                    )
                    engine.backward(loss, scale_wrt_gas=False)  # the loss is normalised for the whole step
                    engine.step()
                    total += float(loss.detach())
                sync()
                times.append(time.perf_counter() - start)
                losses.append(total)
                norm = engine.get_global_grad_norm()
                grad_norms.append(None if norm is None else float(norm))
        except torch.OutOfMemoryError as err:
            record["status"] = f"out of memory: {str(err)[:300]}"
        record.update(
            step_times=times,
            losses=losses,
            grad_norms=grad_norms,
            median_s=statistics.median(times[warmup:]) if len(times) > warmup else None,
            peak_allocated_bytes=0 if cpu else torch.cuda.max_memory_allocated(),
        )
        results.append(record)
        save()
        print(f"[variants] {name}: {record.get('median_s')} s {record.get('status', '')}", flush=True)
        if "status" in record:
            break  # after an out-of-memory the engine's state is not trusted for the rest
    save()


def _checkpointing(value: bool | int) -> str:
    if value is True or value is False:
        return "on" if value else "off"
    return f"first {value} layers"


def variants_table(results: list[dict], warmup: int) -> list[str]:
    """The matrix as a table: each train variant against `base`, each old-log-prob chunking against
    the first; the first measured step's loss and gradient norm, which must agree at lr 0."""
    base = {
        kind: next((r["median_s"] for r in results if r["kind"] == kind and r.get("median_s")), None)
        for kind in ("train", "oldlogp")
    }
    lines = [
        "| variant | measures | rows per chunk | checkpointing | median s | ÷ first of its kind | steps (s) "
        "| first measured loss / sum of log-probs | grad norm | peak allocated GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        times = ", ".join(f"{t:.3f}" for t in r["step_times"])
        if r.get("median_s") is None:
            lines.append(
                f"| {r['variant']} | {r['kind']} | {r['rows_per_chunk']} | | {r.get('status', 'no steps')} "
                f"| | {times} | | | |"
            )
            continue
        loss = r["losses"][warmup] if len(r["losses"]) > warmup else None
        norm = r["grad_norms"][warmup] if len(r["grad_norms"]) > warmup else None
        lines.append(
            f"| {r['variant']} | {'optimizer step' if r['kind'] == 'train' else 'old log-probs, one generation'} "
            f"| {r['rows_per_chunk']} | {_checkpointing(r['gradient_checkpointing'])} | {r['median_s']:.3f} "
            f"| {r['median_s'] / base[r['kind']]:.2f} | {times} | {loss if loss is None else f'{loss:.6g}'} "
            f"| {norm if norm is None else f'{norm:.6g}'} | {r['peak_allocated_bytes'] / 2**30:.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a model folder (python -m bench.grpo --size large makes one)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument(
        "--variants",
        default=None,
        help=f"the training-side variant matrix in one process: 'all' or some of {', '.join(VARIANTS)}",
    )
    parser.add_argument("--file", default="product", choices=FILES, help="the DeepSpeed file of --variants")
    parser.add_argument("--lr", type=float, default=0.0, help="--variants' learning rate (0: every step equal)")
    parser.add_argument("--cpu", action="store_true", help="--variants on the CPU (gloo, float32): a dry run")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--measured-steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="per file, or for the whole --variants run")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if args.variants is not None:
        names = list(VARIANTS) if args.variants == "all" else [n for n in args.variants.split(",") if n]
        unknown = sorted(set(names) - set(VARIANTS))
        if unknown or not names:
            parser.error(f"unknown --variants {unknown}: 'all' or some of {', '.join(VARIANTS)}")
        if args.worker:
            variants_worker(
                names, args.model, out, args.warmup_steps, args.measured_steps, args.file, args.cpu, args.lr
            )
            return 0
        return run_variants(args, names, out)
    names = [n for n in args.files.split(",") if n]
    unknown = sorted(set(names) - set(FILES))
    if unknown:
        parser.error(f"unknown --files {unknown}: choose from {', '.join(FILES)}")
    if args.worker:
        worker(args.worker, args.model, out, args.warmup_steps, args.measured_steps)
        return 0
    install_stop_handlers()
    env = child_env()
    results = []
    for name in names:
        work = out / name
        work.mkdir(parents=True, exist_ok=True)
        code, timed_out = run_child(worker_command(name, args, work), env, work, args.timeout)
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


def worker_command(worker: str, args: argparse.Namespace, work: Path, *extra: str) -> list[str]:
    """The child's command line: this module as `--worker`, with the model, steps and output folder."""
    return [
        sys.executable,
        "-m",
        "bench.zero3_train_step",
        "--worker",
        worker,
        "--model",
        args.model,
        "--out",
        str(work),
        "--warmup-steps",
        str(args.warmup_steps),
        "--measured-steps",
        str(args.measured_steps),
        *extra,
    ]


def child_env() -> dict[str, str]:
    """One training process of its own (a world of one) on a free rendezvous port (two benchmarks or tests may run
    at once), the checkout first on the path."""
    from colocgrpo_dev.ports import free_port

    return dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONPATH=f"{CHECKOUT_PATH}:{os.environ.get('PYTHONPATH', '')}",
        PYTHONUNBUFFERED="1",
    )


def run_variants(args: argparse.Namespace, names: list[str], out: Path) -> int:
    """The variant matrix in one child process (the model loaded once); variants.md / variants.json."""
    install_stop_handlers()
    work = out / "variants"
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--variants", ",".join(names), "--file", args.file, "--lr", str(args.lr)]
    cmd = worker_command("variants", args, work, *extra, *(["--cpu"] if args.cpu else []))
    start = time.perf_counter()
    code, timed_out = run_child(cmd, child_env(), work, args.timeout)
    wall = time.perf_counter() - start
    result = json.loads((work / "result.json").read_text()) if (work / "result.json").exists() else {"variants": []}
    done = [r["variant"] for r in result["variants"]]
    problems = [f"{r['variant']}: {r['status']}" for r in result["variants"] if "status" in r]
    problems += [f"{n}: not run" for n in names if n not in done]
    if code != 0:
        problems.append(
            f"worker {'timed out' if timed_out else f'failed (rc {code})'} after {wall:.0f} s:\n"
            + (work / "stderr.log").read_text(errors="replace")[-1500:]
        )
    lines = [
        f"DeepSpeed file {args.file}, lr {args.lr}, {args.warmup_steps} warm-up + {args.measured_steps} measured "
        f"steps per variant, {wall:.0f} s in one process",
        "",
        *variants_table(result["variants"], args.warmup_steps),
    ]
    lines += [f"\nNOT MEASURED: {p}" for p in problems]
    summary = {**result, "warmup_steps": args.warmup_steps, "measured_steps": args.measured_steps, "wall_s": wall}
    summary["problems"] = problems
    (out / "variants.json").write_text(json.dumps(summary, indent=2))
    (out / "variants.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
