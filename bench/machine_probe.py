"""How fast a machine is right now, and a warm-up of its host memory, for the GPU benchmark's protocol.

    python3 -m bench.machine_probe --out DIR [--touch-gib auto|N] [--chunk-gib 4] [--no-warm-up]

The lent GPU machines are virtual machines, and some pair runs are slower for every contender (ours 1.83-2.04
s/step against 1.56-1.64 in other runs, TRL alike), which an absolute target (ours <= 4x the hardware floor)
cannot average away. This probe tells whether the machine is slow right now, and why, in one process:

- the host CPU: a fixed single-threaded Python loop (seconds);
- host memory: chunks of `--chunk-gib` allocated and written until `--touch-gib` are held at once,
  timed per chunk (GiB/s); everything freed, then the same again. A first pass much slower than the
  second means guest memory that the hypervisor backs only when first touched;
- pinned host memory: allocating 2 GiB page-locked (seconds), and copying it to the GPU (GiB/s);
- the GPU: a launch-bound loop (microseconds per tiny kernel, what ZeRO-3's hooks and decoding pay)
  and a bf16 matmul loop (TFLOP/s).

The CPU and GPU measurements run before and after the two memory passes; the passes are the warm-up
(`--no-warm-up`: one pass of one chunk only). Writes DIR/machine_probe.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

GIB = 2**30
HOST_MARGIN_GIB = 8  # left free for the system and this process when --touch-gib is auto


def available_gib() -> float:
    """`MemAvailable` from /proc/meminfo, in GiB (0 where unreadable)."""
    with suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    return 0.0


def touch_plan(touch_gib: str, chunk_gib: int, available: float) -> int:
    """How many chunks of `chunk_gib` to hold at once: `touch_gib` of them, or with "auto" all the available
    memory but `HOST_MARGIN_GIB`; at least one.

    Raises:
        ValueError: `touch_gib` is neither "auto" nor a positive number, or `chunk_gib` is not positive.
    """
    if chunk_gib <= 0:
        raise ValueError(f"--chunk-gib must be positive, got {chunk_gib}")
    if touch_gib == "auto":
        total = available - HOST_MARGIN_GIB
    else:
        try:
            total = float(touch_gib)
        except ValueError:
            raise ValueError(f"--touch-gib must be 'auto' or a number of GiB, got {touch_gib!r}") from None
        if total <= 0:
            raise ValueError(f"--touch-gib must be positive, got {touch_gib!r}")
    return max(1, int(total // chunk_gib))


def summarize(rates: list[float]) -> dict[str, float]:
    """Median, min and max of per-chunk rates (GiB/s); empty stays empty."""
    if not rates:
        return {}
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "n": len(rates)}


def cpu_loop_seconds(n: int = 5_000_000) -> float:
    """A fixed single-threaded Python loop: what the host CPU gives one interpreter right now."""
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i & 7
    return time.perf_counter() - start


def memory_pass(chunks: int, chunk_gib: int) -> list[float]:
    """Allocate and write `chunks` chunks, all held at once (distinct pages), then free them; GiB/s per chunk."""
    import torch

    held = []
    rates = []
    for _ in range(chunks):
        start = time.perf_counter()
        block = torch.empty(chunk_gib * GIB, dtype=torch.uint8)
        block.fill_(1)
        rates.append(chunk_gib / (time.perf_counter() - start))
        held.append(block)
    del held
    return rates


def gpu_probe() -> dict[str, Any]:
    """Launch latency, bf16 matmul throughput and a pinned host-to-device copy; empty without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda")
    tiny = torch.zeros(1, device=dev)
    for _ in range(100):
        tiny.add_(1)
    torch.cuda.synchronize()
    launches = 20_000
    start = time.perf_counter()
    for _ in range(launches):
        tiny.add_(1)
    torch.cuda.synchronize()
    launch_us = (time.perf_counter() - start) / launches * 1e6

    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    reps = 50
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    tflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
    del a, b

    start = time.perf_counter()
    pinned = torch.empty(2 * GIB, dtype=torch.uint8, pin_memory=True)
    pin_s = time.perf_counter() - start
    on_gpu = torch.empty(2 * GIB, dtype=torch.uint8, device=dev)
    on_gpu.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    on_gpu.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    h2d = 2 / (time.perf_counter() - start)
    del pinned, on_gpu
    torch.cuda.empty_cache()
    # Give the pinned block back too: torch's host allocator would serve the next probe's
    # allocation from its cache, and time nothing.
    torch._C._host_emptyCache()
    return {"launch_us": launch_us, "matmul_tflops": tflops, "pin_2gib_s": pin_s, "h2d_gib_s": h2d}


def probe(touch_gib: str = "auto", chunk_gib: int = 4, warm_up: bool = True) -> dict[str, Any]:
    """The probe's measurements in order (see the module docstring)."""
    result: dict[str, Any] = {"available_gib_before": available_gib()}
    chunks = touch_plan(touch_gib, chunk_gib, result["available_gib_before"]) if warm_up else 1
    result["before"] = {"cpu_loop_s": cpu_loop_seconds(), **gpu_probe()}
    start = time.perf_counter()
    first = memory_pass(chunks, chunk_gib)
    second = memory_pass(chunks, chunk_gib) if warm_up else []
    result["memory"] = {
        "chunk_gib": chunk_gib,
        "chunks": chunks,
        "first_pass_gib_s": summarize(first),
        "second_pass_gib_s": summarize(second),
        "first_pass_rates": [round(r, 2) for r in first],
        "seconds": time.perf_counter() - start,
    }
    result["after"] = {"cpu_loop_s": cpu_loop_seconds(), **gpu_probe()}
    result["available_gib_after"] = available_gib()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--touch-gib", default="auto", help="host memory held at once per pass ('auto': all but 8 GiB)")
    parser.add_argument("--chunk-gib", type=int, default=4)
    parser.add_argument("--no-warm-up", action="store_true", help="one pass of one chunk: measure, do not warm")
    args = parser.parse_args(argv)
    try:
        result = probe(args.touch_gib, args.chunk_gib, warm_up=not args.no_warm_up)
    except ValueError as exc:
        print(f"machine_probe: {exc}", file=sys.stderr)
        return 2
    from bench.grpo.report import host_info

    result["host"] = host_info()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "machine_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    mem = result["memory"]
    first, second = mem["first_pass_gib_s"], mem["second_pass_gib_s"]
    print(
        f"machine probe: cpu loop {result['before']['cpu_loop_s']:.3f} -> {result['after']['cpu_loop_s']:.3f} s; "
        f"host memory {mem['chunks']} x {mem['chunk_gib']} GiB: first pass {first.get('median', 0):.1f} GiB/s "
        f"(min {first.get('min', 0):.1f}), second {second.get('median', 0):.1f} GiB/s, {mem['seconds']:.0f} s"
    )
    for when in ("before", "after"):
        gpu = {k: round(v, 3) for k, v in result[when].items() if k != "cpu_loop_s"}
        if gpu:
            print(f"  gpu {when}: {gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
