"""ZeRO-3's collectives per optimizer step, counted at several ranks on the CPU, per ZeRO section.

    python3 -m bench.zero3_collectives --out DIR [--world 4] [--layers 4] [--hidden 256] [--files auto,persist,...]

The step profile's part that needs no GPU: how many all-gathers, reduce-scatters and all-reduces one optimizer step
of a ZeRO-3 training side issues, and how many bytes they move, under each ZeRO section `bench.zero3_train_step`
compares (`planned` is what the operator renders for a multi-GPU job, `auto` transformers' "auto" values as
transformers fills them).
The count is what the GPU's step time is made of besides the math: every all-gather is a launch, a wait and, for
parameters ZeRO-3 releases after use, a second fetch in the backward and a third in the checkpointed recompute.

One step is TRL's: `gradient_accumulation_steps` micro-batches, forward + backward with non-reentrant gradient
checkpointing, then the optimizer. Every rank trains on rows of its own (its own seed and its own completion
length), as GRPO's ranks do; the counts must still be equal on every rank, and the report says whether they are.
A warm-up step runs first (the optimizer's state and DeepSpeed's first fetch of each parameter), then the counted one.

Each section runs in WORLD processes of its own (gloo, float32, a tiny Qwen2 model of `--layers` layers built here).
The report (DIR/collectives.json and a table on stdout) gives per section the calls and MiB of each collective in the
counted step, per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The torch.distributed functions DeepSpeed's communication layer reaches (deepspeed/comm/torch.py), by the name
# the report uses: ZeRO-3's parameter fetch (all-gather), its gradient partitioning (reduce-scatter, or all-reduce
# of a bucket), and the small control traffic (the overflow and gradient-norm all-reduces, broadcasts, barriers).
COUNTED = {
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "barrier": "barrier",
}
ROWS, ACCUMULATION, PROMPT_TOKENS, COMPLETION_TOKENS = 4, 2, 16, 48


def install_counter() -> tuple[Counter[str], Counter[str], list[bool]]:
    """Wrap the counted torch.distributed functions (before DeepSpeed captures any of them): calls and bytes of
    each, counted while the returned flag's first item is True."""
    import torch.distributed as dist

    calls: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    counting = [False]

    def wrap(name: str, label: str) -> None:
        original = getattr(dist, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if counting[0]:
                calls[label] += 1
                tensors = [a for a in (*args, *kwargs.values()) if hasattr(a, "element_size")]
                sizes[label] += max((t.numel() * t.element_size() for t in tensors), default=0)
            return original(*args, **kwargs)

        setattr(dist, name, counted)

    for name, label in COUNTED.items():
        if hasattr(dist, name):
            wrap(name, label)
    return calls, sizes, counting


def worker(file: str, model_dir: str, out: Path) -> None:
    """One rank: initialise the section's engine, run a warm-up step and a counted one, write rank-N.json."""
    calls, sizes, counting = install_counter()
    import deepspeed
    import torch

    from bench.zero3_train_step import load_for_zero3, model_shape, training_file, zero_sections

    rank = int(os.environ["RANK"])
    config = training_file(zero_sections(model_shape(model_dir))[file], ROWS, ACCUMULATION, bf16=False)
    model, _ds_config = load_for_zero3(model_dir, config, cpu=True)  # _ds_config lives while the model trains
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    engine.train()
    engine.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    generator = torch.Generator().manual_seed(1000 + rank)
    tokens = PROMPT_TOKENS + COMPLETION_TOKENS - 8 * rank  # ranks see rows of different lengths
    vocab = model.config.vocab_size
    seconds = []
    for step in range(2):
        counting[0] = step == 1
        start = time.perf_counter()
        for _ in range(ACCUMULATION):
            ids = torch.randint(0, vocab, (ROWS, tokens), generator=generator)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        seconds.append(time.perf_counter() - start)
    counting[0] = False
    persistent = sum(bool(getattr(p, "ds_persist", False)) for p in engine.module.parameters())
    result = {
        "file": file,
        "rank": rank,
        "tokens_per_row": tokens,
        "calls": dict(sorted(calls.items())),
        "bytes": dict(sorted(sizes.items())),
        "seconds": seconds,
        "persistent_parameters": persistent,
        "parameters": sum(1 for _ in engine.module.parameters()),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(result, indent=2))
    # Leave the process group before the interpreter does: a gloo group alive at exit can abort the process
    # ("terminate called without an active exception") after its result is written.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def count_section(file: str, model_dir: Path, work: Path, world: int, timeout: float) -> list[dict[str, Any]]:
    """Run one section at `world` ranks; returns each rank's result."""
    from bench.zero3_train_step import CHECKOUT_PATH
    from colocgrpo_dev.ports import free_port

    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "LOCAL_", "GROUP_"))}
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=CHECKOUT_PATH,
    )
    command = [sys.executable, "-m", "bench.zero3_collectives", "--worker", file, "--model", str(model_dir)]
    processes = []
    for rank in range(world):
        with open(work / f"rank-{rank}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    [*command, "--out", str(work)],
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
    failed = {rank: p.returncode for rank, p in enumerate(processes) if p.returncode}
    if failed:
        tail = (work / f"rank-{min(failed)}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"section {file}: ranks exited {failed}:\n{tail}")
    return [json.loads((work / f"rank-{rank}.json").read_text()) for rank in range(world)]


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per section: rank 0's calls and MiB per collective, and whether every rank issued the same calls."""
    summary: dict[str, Any] = {}
    for file, ranks in results.items():
        first = ranks[0]
        summary[file] = {
            "calls": first["calls"],
            "mib": {k: round(v / 2**20, 3) for k, v in first["bytes"].items()},
            "equal_on_every_rank": all(r["calls"] == first["calls"] for r in ranks),
            "tokens_per_row_by_rank": [r["tokens_per_row"] for r in ranks],
            "persistent_parameters": f"{first['persistent_parameters']} of {first['parameters']}",
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    kinds = sorted({k for s in summary.values() for k in s["calls"]})
    header = "| section | " + " | ".join(f"{k} calls (MiB)" for k in kinds) + " | same on every rank | persistent |"
    lines = [header, "|" + "---|" * (len(kinds) + 3)]
    for file, s in summary.items():
        cells = [f"{s['calls'].get(k, 0)} ({s['mib'].get(k, 0):g})" for k in kinds]
        lines.append(
            f"| {file} | " + " | ".join(cells) + f" | {s['equal_on_every_rank']} | {s['persistent_parameters']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zero3_collectives", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--files", default="plain,auto,planned,persist,product", help="ZeRO sections, comma-separated")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per section")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.model, args.out)
        return 0
    from colocgrpo_dev.models.tiny import build_tiny_model

    args.out.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(args.out / "model", hidden_size=args.hidden, num_layers=args.layers)
    files = [f for f in args.files.split(",") if f]
    results = {f: count_section(f, model, args.out / f, args.world, args.timeout) for f in files}
    summary = summarize(results)
    report = {
        "command": " ".join(["python3 -m bench.zero3_collectives", *(argv if argv is not None else sys.argv[1:])]),
        "world": args.world,
        "layers": args.layers,
        "hidden": args.hidden,
        "step": {"micro_batches": ACCUMULATION, "rows": ROWS, "gradient_checkpointing": "non-reentrant"},
        "sections": summary,
        "ranks": results,
    }
    (args.out / "collectives.json").write_text(json.dumps(report, indent=2))
    print(table(summary))
    return 0 if all(s["equal_on_every_rank"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
