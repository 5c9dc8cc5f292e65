"""Fuzz the operator through the real API server with mutated ColocGRPOJob manifests.

Manifests start from examples/tiny-cpu.yaml (made small) and get 1-4 random mutations each: a
field set to a value of the wrong type, out of range, huge, empty, deeply nested, unicode, or
removed; an unknown trainerArgs key; a free-form Kubernetes field (tolerations, affinity, env,
volumes) filled with garbage; a 300,000-character string; durations of 2^62 seconds. They are
sent in bursts (`--burst`, each in a namespace of its own) to one operator; with `--workers N`,
N bursts at a time, each worker with an operator of its own watching only its namespaces. Burst i
is made from seed*1000+i, whatever the worker count; bursts --first .. the last run (a run cut
short by --time-budget goes on with --first set to the number of bursts done). Checks:

- the API server refuses with 400/422 (or 413 for a body too large) and a message naming a field,
  or stores the job;
- the operator never dies (0 crashes) and logs no Python traceback;
- every stored job reaches a phase (its status.phase is set) within 30 s of the burst's end;
- a valid job created after each burst gets its batch Job within 5 s (from that burst's operator).

Usage: python -m bench.fuzz [--manifests 10000] [--burst 100] [--seed 1] [--workers 1] [--first 0]
                            [--time-budget SECONDS] [--kubeconfig FILE] [--cluster-name colocgrpo-chaos]
                            [--out FILE]
Prints one JSON line per burst as it finishes and a summary at the end, with --out also into FILE;
exit 1 if any check failed.
docs/benchmarks/chaos.md records runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.chaos import REPO, Cluster, ensure_cluster
from colocgrpo_dev.operator_process import OperatorProcess

PHASE_SECONDS = 30.0
SERVED_SECONDS = 5.0

# Where mutations land: every section of the spec, free-form Kubernetes fields, metadata.
PATHS: list[tuple[str | int, ...]] = [
    ("spec",),
    ("spec", "model"),
    ("spec", "model", "name"),
    ("spec", "model", "dtype"),
    ("spec", "model", "revision"),
    ("spec", "dataset"),
    ("spec", "dataset", "name"),
    ("spec", "dataset", "promptColumn"),
    ("spec", "dataset", "maxPromptTokens"),
    ("spec", "resources"),
    ("spec", "resources", "nodes"),
    ("spec", "resources", "gpusPerNode"),
    ("spec", "resources", "cpu"),
    ("spec", "resources", "memory"),
    ("spec", "resources", "extra"),
    ("spec", "resources", "gpuMemoryGiB"),
    ("spec", "rewards"),
    ("spec", "rewards", 0),
    ("spec", "rewards", 0, "function"),
    ("spec", "rewards", 0, "weight"),
    ("spec", "trainerArgs"),
    ("spec", "trainerArgs", "max_steps"),
    ("spec", "trainerArgs", "learning_rate"),
    ("spec", "trainerArgs", "run_name"),
    ("spec", "trainerArgs", "bogus_arg"),
    ("spec", "scheduling"),
    ("spec", "scheduling", "tolerations"),
    ("spec", "scheduling", "affinity"),
    ("spec", "scheduling", "nodeSelector"),
    ("spec", "scheduling", "queueName"),
    ("spec", "scheduling", "priorityClassName"),
    ("spec", "podTemplate"),
    ("spec", "podTemplate", "env"),
    ("spec", "podTemplate", "volumes"),
    ("spec", "podTemplate", "volumeMounts"),
    ("spec", "runPolicy"),
    ("spec", "runPolicy", "maxRestarts"),
    ("spec", "runPolicy", "suspend"),
    ("spec", "runPolicy", "activeDeadlineSeconds"),
    ("spec", "runPolicy", "stallTimeoutSeconds"),
    ("spec", "runPolicy", "ttlSecondsAfterFinished"),
    ("spec", "image"),
    ("spec", "command"),
    ("spec", "checkpoint"),
    ("spec", "checkpoint", "path"),
    ("spec", "vllm"),
    ("spec", "vllm", "gpuMemoryUtilization"),
    ("spec", "vllm", "tensorParallelSize"),
    ("spec", "vllm", "offloadTrainerState"),
    ("spec", "deepspeed"),
    ("spec", "deepspeed", "zeroStage"),
    ("spec", "training"),
    ("spec", "training", "microBatchMerge"),
    ("spec", "cache"),
    ("metadata", "labels"),
    ("metadata", "annotations"),
]
FREE_FORM = [
    ("spec", "scheduling", "tolerations"),
    ("spec", "scheduling", "affinity"),
    ("spec", "podTemplate", "env"),
    ("spec", "podTemplate", "volumes"),
    ("spec", "trainerArgs", "run_name"),
    ("spec", "runPolicy", "activeDeadlineSeconds"),
    ("spec", "runPolicy", "stallTimeoutSeconds"),
    ("spec", "runPolicy", "ttlSecondsAfterFinished"),
]
WORDS = ["", "-1", "1e9", "Never", "cpu", "a:b", "/etc/x", "Gi", "ü🙂", "null", "true", "0x10", "1Gi", "100m", " "]
HUGE = [2**31, 2**53, 2**62, 9223372037, -(2**62), 10**20]


def leaf(rng: random.Random) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-(2**40), 2**40)
    if kind == 3:
        return rng.choice(HUGE)
    if kind == 4:
        return rng.uniform(-1e6, 1e6)
    if kind == 5:
        return rng.choice(WORDS)
    if kind == 6:
        return "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 12)))
    if kind == 7:
        return rng.randint(0, 100)
    return "x" * rng.choice([64, 253, 1024, 70_000])


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth >= 3 or roll < 0.6:
        return leaf(rng)
    if roll < 0.8:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["key", "name", "value", "x", "operator", "effect", "ü"]): value(rng, depth + 1) for _ in range(3)
    }


def free_form_value(rng: random.Random, path: tuple[str | int, ...]) -> Any:
    """Garbage the schema lets through (free-form objects, any trainerArgs value, big numbers)."""
    last = path[-1]
    if last == "tolerations":
        return [{rng.choice(["key", "operator", "effect", "value", "x"]): leaf(rng) for _ in range(2)}]
    if last == "env":
        return [{"name": rng.choice(["A", "B-1", "", "ü"]), "value": leaf(rng)}]
    if last == "run_name":
        return "r" * rng.choice([10, 300_000])
    if last in ("activeDeadlineSeconds", "stallTimeoutSeconds", "ttlSecondsAfterFinished"):
        return rng.choice([*HUGE, 0, 1, 59, 3600])
    return {rng.choice(["nodeAffinity", "podAffinity", "x"]): value(rng, 1)}


def set_path(body: dict[str, Any], path: tuple[str | int, ...], new: Any, remove: bool = False) -> None:
    node: Any = body
    for part in path[:-1]:
        if isinstance(part, int):
            if not isinstance(node, list) or len(node) <= part:
                return
            node = node[part]
        else:
            if not isinstance(node, dict):
                return
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
    last = path[-1]
    if isinstance(last, int):
        if isinstance(node, list) and len(node) > last:
            node[last] = new
    elif isinstance(node, dict):
        if remove:
            node.pop(last, None)
        else:
            node[last] = new


def base_manifest(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name}
    body["spec"]["resources"].update(cpu="10m", memory="16Mi")
    return body


def mutated(name: str, rng: random.Random) -> dict[str, Any]:
    body = base_manifest(name)
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.35:
            path = rng.choice(FREE_FORM)
            set_path(body, path, free_form_value(rng, path))
        else:
            path = rng.choice(PATHS)
            set_path(body, path, value(rng), remove=rng.random() < 0.1)
    return body


def burst_manifests(seed: int, number: int, burst: int, manifests: int) -> list[dict[str, Any]]:
    """Burst `number`'s manifests: from its own seed (seed*1000+number), named f<index> by their
    place in the whole run."""
    rng = random.Random(seed * 1000 + number)
    first = number * burst
    return [mutated(f"f{first + i}", rng) for i in range(min(burst, manifests - first))]


def names_a_field(message: str) -> bool:
    fields = ("spec.", "metadata.", "spec:", "metadata:", "struct field", "Request entity too large")
    return any(token in message for token in fields)


def run_burst(
    cluster: Cluster, operator: OperatorProcess, namespace: str, manifests: list[dict[str, Any]], threads: int
) -> dict[str, Any]:
    from colocgrpo_operator.kube.client import KubeApiError

    result: dict[str, Any] = {"namespace": namespace, "sent": len(manifests), "accepted": 0, "refused": 0}
    unexpected: list[str] = []
    unnamed: list[str] = []
    accepted: dict[str, float] = {}

    def send(body: dict[str, Any]) -> None:
        try:
            cluster.create_job(namespace, body)
        except KubeApiError as error:
            if error.status not in (400, 413, 422):
                unexpected.append(f"{error.status}: {error.message[:200]}")
            elif not names_a_field(error.message):
                unnamed.append(error.message[:200])
            return
        accepted[body["metadata"]["name"]] = time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, manifests))
    result["accepted"] = len(accepted)
    result["refused"] = len(manifests) - len(accepted) - len(unexpected)
    result["unexpected_answers"] = unexpected[:5]
    result["refusals_naming_no_field"] = len(unnamed)
    result["refusal_examples_naming_no_field"] = unnamed[:3]

    # Every stored job reaches a phase within PHASE_SECONDS of the burst's end.
    burst_end = time.monotonic()
    phased: dict[str, float] = {}
    while len(phased) < len(accepted) and time.monotonic() - burst_end < PHASE_SECONDS:
        for job in cluster.jobs(namespace):
            name = job["metadata"]["name"]
            if name in accepted and name not in phased and (job.get("status") or {}).get("phase"):
                phased[name] = time.monotonic() - burst_end
        time.sleep(0.5)
    result["without_phase"] = sorted(set(accepted) - set(phased))[:10]
    result["phase_seconds_max"] = round(max(phased.values(), default=0.0), 2)

    # A valid job created now is served within SERVED_SECONDS (its batch Job exists).
    probe = f"valid-{uuid.uuid4().hex[:5]}"
    cluster.create_job(namespace, base_manifest(probe))
    created = time.monotonic()
    served = None
    while time.monotonic() - created < 30:
        if cluster.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{probe}"):
            served = time.monotonic() - created
            break
        time.sleep(0.1)
    result["valid_job_served_seconds"] = round(served, 2) if served is not None else None
    result["operator_alive"] = operator.alive()
    return result


class FuzzWorker:
    """One worker: its own operator (watching `<prefix>-w<k>-*`), client and log."""

    def __init__(self, index: int, prefix: str, kubeconfig: Path, work: Path, src: Path):
        self.index = index
        self.prefix = f"{prefix}-w{index}"
        self.cluster = Cluster(kubeconfig)
        self.operator = OperatorProcess(kubeconfig, [f"{self.prefix}-*"], work / f"operator-w{index}.log", checkout=src)
        self.crashes = 0
        self.namespaces: list[str] = []

    def burst(self, seed: int, number: int, size: int, total: int, threads: int) -> dict[str, Any]:
        namespace = f"{self.prefix}-{number}"
        manifests = burst_manifests(seed, number, size, total)
        self.namespaces.append(namespace)
        try:
            self.cluster.new_namespace(namespace)
            result = run_burst(self.cluster, self.operator, namespace, manifests, threads)
        except Exception as error:  # a failed burst, not a lost run
            result = {"namespace": namespace, "sent": len(manifests), "accepted": 0, "refused": 0}
            result["error"] = repr(error)
            result["operator_alive"] = self.operator.alive()
        result = {"burst": number, "seed": seed * 1000 + number, "worker": self.index, **result}
        if not result["operator_alive"]:
            self.crashes += 1
            self.operator.start()
        self.cluster.delete_namespace(namespace)
        return result

    def close(self) -> None:
        self.operator.stop()
        for namespace in self.namespaces:
            self.cluster.delete_namespace(namespace)


def main(argv: list[str] | None = None) -> int:
    from bench.workers import Reporter, host_facts, load_average, run_numbered

    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", type=int, default=10_000)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--threads", type=int, default=4, help="client threads sending one burst")
    parser.add_argument("--seed", type=int, default=1, help="burst i is made from seed*1000+i")
    parser.add_argument("--workers", type=int, default=1, help="bursts at once, each worker with its own operator")
    parser.add_argument("--first", type=int, default=0, help="the first burst's number (to go on with a run)")
    parser.add_argument("--time-budget", type=float, default=None, help="start no burst after this many seconds")
    parser.add_argument("--kubeconfig", default=None, help="default: start/reuse a local dev cluster")
    parser.add_argument("--cluster-name", default="colocgrpo-chaos")
    parser.add_argument("--operator-src", default=str(REPO))
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--out", default=None, help="also write the JSON lines and the summary into this file")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.burst < 1:
        parser.error("--workers and --burst must be at least 1")
    load_at_start = load_average()
    kubeconfig = ensure_cluster(args.kubeconfig, args.cluster_name)
    work = Path(args.log_dir or tempfile.mkdtemp(prefix="colocgrpo-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    prefix = f"fuzz-{args.seed}-{uuid.uuid4().hex[:4]}"
    workers = [FuzzWorker(k, prefix, kubeconfig, work, Path(args.operator_src)) for k in range(args.workers)]
    bursts = (args.manifests + args.burst - 1) // args.burst
    reporter = Reporter(args.out)
    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(lambda w: w.operator.start(), workers))
        results = run_numbered(
            bursts,
            args.workers,
            args.time_budget,
            started,
            lambda k, n: workers[k].burst(args.seed, n, args.burst, args.manifests, args.threads),
            reporter.line,
            first=args.first,
        )
    finally:
        for worker in workers:
            worker.close()
    try:
        summary, failed = summarize(results, workers, time.monotonic() - started, work)
        summary.update(seed=args.seed, first=args.first, workers=args.workers)
        summary["host"] = host_facts(load_at_start)
        reporter.summary(summary)
    finally:
        reporter.close()
    return 0 if not failed else 1


def summarize(
    results: list[dict[str, Any]], workers: list[FuzzWorker], seconds: float, work: Path
) -> tuple[dict[str, Any], bool]:
    """The run's summary, and whether any check failed."""
    tracebacks = [t for w in workers for t in w.operator.tracebacks()]
    crashes = sum(w.crashes for w in workers)
    served_all = [r.get("valid_job_served_seconds") for r in results]
    served = [s for s in served_all if s is not None]
    summary: dict[str, Any] = {
        "manifests": sum(r["sent"] for r in results),
        "bursts": len(results),
        "accepted": sum(r["accepted"] for r in results),
        "refused": sum(r["refused"] for r in results),
        "unexpected_answers": sum(len(r.get("unexpected_answers", [])) for r in results),
        "refusals_naming_no_field": sum(r.get("refusals_naming_no_field", 0) for r in results),
        "burst_errors": [f"burst {r['burst']}: {r['error']}" for r in results if "error" in r],
        "operator_crashes": crashes,
        "tracebacks": len(tracebacks),
        "traceback_examples": tracebacks[:3],
        "jobs_without_phase_in_30s": sum(len(r.get("without_phase", [])) for r in results),
        "phase_seconds_max": max((r.get("phase_seconds_max", 0.0) for r in results), default=0.0),
        "valid_job_served_seconds": served_all,
        "valid_job_served_seconds_median": round(statistics.median(served), 2) if served else None,
        "valid_job_served_seconds_max": max(served, default=None),
        "valid_jobs_served_over_goal": sum(1 for s in served if s > SERVED_SECONDS),
        "valid_jobs_not_served": len(served_all) - len(served),
        "served_goal_seconds": SERVED_SECONDS,
        "seconds": round(seconds, 1),
        "logs": str(work),
    }
    failed = bool(
        crashes
        or tracebacks
        or summary["burst_errors"]
        or summary["unexpected_answers"]
        or summary["jobs_without_phase_in_30s"]
        or summary["valid_jobs_not_served"]
        or summary["valid_jobs_served_over_goal"]
    )
    summary["passed"] = not failed
    return summary, failed


if __name__ == "__main__":
    sys.exit(main())
