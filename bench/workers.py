"""What bench/chaos.py and bench/fuzz.py share to run on several workers against one cluster.

- `run_numbered`: N worker threads take trial (or burst) numbers 0, 1, 2, ... from one shared
  counter, so what number i does depends on --seed and i only, never on the worker count or on
  which worker got it; no number is started once the time budget is spent.
- `Reporter`: one JSON line per finished trial or burst and the summary at the end, printed
  under a lock (lines of concurrent workers never interleave) and, with --out, written to a
  file as well.
- `host_facts`: the machine a run ran on, for the summary (core count, CPU model, load).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


def cpu_model() -> str:
    """The "model name" line of /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def host_facts(load_at_start: list[float]) -> dict[str, Any]:
    """The machine, and its 1/5/15-minute load averages at the start and now (the end)."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "load_average_start": load_at_start,
        "load_average_end": load_average(),
    }


class Reporter:
    """Prints (and with `out`, writes) the JSON lines and the summary, one writer at a time."""

    def __init__(self, out: str | None = None):
        self.lock = threading.Lock()
        self.file: IO[str] | None = None
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(out, "w")  # noqa: SIM115 (closed in close())

    def _write(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            if self.file is not None:
                self.file.write(text + "\n")
                self.file.flush()

    def line(self, record: dict[str, Any]) -> None:
        self._write(json.dumps(record))

    def summary(self, summary: dict[str, Any]) -> None:
        self._write(json.dumps(summary, indent=1))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def run_numbered(
    count: int,
    workers: int,
    time_budget: float | None,
    started: float,
    work: Callable[[int, int], T],
    done: Callable[[T], None],
    first: int = 0,
) -> list[T]:
    """Run `work(worker, number)` for number = first .. count-1 on `workers` threads, each number
    once, taken in order from a shared counter; no number starts after `time_budget` seconds from
    `started` (time.monotonic()). `done(result)` is called as each one finishes. Returns the
    results in number order. An exception in `work` stops that worker's loop and is raised here
    once every worker has stopped (the drivers turn their expected failures into problems).
    """
    lock = threading.Lock()
    taken = [first]
    results: dict[int, T] = {}

    def take() -> int | None:
        with lock:
            if taken[0] >= count:
                return None
            if time_budget is not None and time.monotonic() - started > time_budget:
                return None
            taken[0] += 1
            return taken[0] - 1

    def loop(worker: int) -> None:
        while (number := take()) is not None:
            result = work(worker, number)
            with lock:
                results[number] = result
            done(result)

    with concurrent.futures.ThreadPoolExecutor(max(1, workers), thread_name_prefix="bench-worker") as pool:
        futures = [pool.submit(loop, worker) for worker in range(max(1, workers))]
    for future in futures:
        future.result()
    return [results[n] for n in sorted(results)]
