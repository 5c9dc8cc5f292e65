"""Fuzz the operator through the real API server with mutated ColocGRPOJob manifests.

Manifests start from examples/tiny-cpu.yaml (made small) and get 1-4 random mutations each: a
field set to a value of the wrong type, out of range, huge, empty, deeply nested, unicode, or
removed; an unknown trainerArgs key; a free-form Kubernetes field (tolerations, affinity, env,
volumes) filled with garbage; a 300,000-character string; durations of 2^62 seconds. They are
sent in bursts (`--burst`, each in a namespace of its own) to one operator. Checks:

- the API server refuses with 400/422 (or 413 for a body too large) and a message naming a field,
  or stores the job;
- the operator never dies (0 crashes) and logs no Python traceback;
- every stored job reaches a phase (its status.phase is set) within 30 s of the burst's end;
- a valid job created after each burst gets its batch Job within 5 s.

Usage: python -m bench.fuzz [--manifests 10000] [--burst 100] [--seed 1] [--time-budget SECONDS]
                            [--kubeconfig FILE] [--cluster-name colocgrpo-chaos]
Prints one JSON line per burst and a summary at the end; exit 1 if any check failed.
docs/benchmarks/chaos.md records runs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.chaos import REPO, Cluster, Operator, ensure_cluster

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
    ("spec", "deepspeed"),
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


def names_a_field(message: str) -> bool:
    fields = ("spec.", "metadata.", "spec:", "metadata:", "struct field", "Request entity too large")
    return any(token in message for token in fields)


def run_burst(
    cluster: Cluster, operator: Operator, namespace: str, manifests: list[dict[str, Any]], threads: int
) -> dict[str, Any]:
    from colocgrpo_operator.controller.kube import KubeApiError

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", type=int, default=10_000)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-budget", type=float, default=None, help="start no burst after this many seconds")
    parser.add_argument("--kubeconfig", default=None, help="default: start/reuse a local dev cluster")
    parser.add_argument("--cluster-name", default="colocgrpo-chaos")
    parser.add_argument("--operator-src", default=str(REPO))
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    kubeconfig = ensure_cluster(args.kubeconfig, args.cluster_name)
    cluster = Cluster(kubeconfig)
    work = Path(args.log_dir or tempfile.mkdtemp(prefix="colocgrpo-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    prefix = f"fuzz-{args.seed}-{uuid.uuid4().hex[:4]}"
    bursts = [f"{prefix}-{i}" for i in range((args.manifests + args.burst - 1) // args.burst)]
    operator = Operator(kubeconfig, [f"{prefix}-*"], work / "operator.log", Path(args.operator_src))
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    crashes = 0
    try:
        operator.start()
        sent = 0
        for namespace in bursts:
            if args.time_budget is not None and time.monotonic() - started > args.time_budget:
                break
            count = min(args.burst, args.manifests - sent)
            manifests = [mutated(f"f{sent + i}", rng) for i in range(count)]
            sent += count
            cluster.new_namespace(namespace)
            result = run_burst(cluster, operator, namespace, manifests, args.threads)
            if not result["operator_alive"]:
                crashes += 1
                operator.start()
            cluster.delete_namespace(namespace)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        operator.stop()
        for namespace in bursts:
            cluster.delete_namespace(namespace)
    tracebacks = operator.tracebacks()
    summary = {
        "manifests": sum(r["sent"] for r in results),
        "accepted": sum(r["accepted"] for r in results),
        "refused": sum(r["refused"] for r in results),
        "unexpected_answers": sum(len(r["unexpected_answers"]) for r in results),
        "refusals_naming_no_field": sum(r["refusals_naming_no_field"] for r in results),
        "operator_crashes": crashes,
        "tracebacks": len(tracebacks),
        "traceback_examples": tracebacks[:3],
        "jobs_without_phase_in_30s": sum(len(r["without_phase"]) for r in results),
        "phase_seconds_max": max((r["phase_seconds_max"] for r in results), default=0.0),
        "valid_job_served_seconds": [r["valid_job_served_seconds"] for r in results],
        "seconds": round(time.monotonic() - started, 1),
        "log": str(work / "operator.log"),
    }
    served = [s for s in summary["valid_job_served_seconds"] if s is not None]
    failed = (
        crashes
        or tracebacks
        or summary["unexpected_answers"]
        or summary["jobs_without_phase_in_30s"]
        or len(served) < len(results)
        or any(s > SERVED_SECONDS for s in served)
    )
    summary["passed"] = not failed
    print(json.dumps(summary, indent=1), flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
