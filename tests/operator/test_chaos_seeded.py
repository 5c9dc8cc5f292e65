"""The chaos trials and the manifest fuzzer (bench/chaos.py, bench/fuzz.py), seeded and small enough
for every test run (about two minutes together on a loaded 2-core machine); the full runs and their
figures are in docs/benchmarks/chaos.md."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bench import chaos, fuzz
from bench.workers import run_numbered


def _summary(output: str) -> dict:
    return json.loads(output[output.index("\n{\n") :])


@pytest.mark.cluster
def test_seeded_chaos_trial_leaves_nothing_wrong(kube_cluster, crd_installed, tmp_path, capsys) -> None:
    code = chaos.main(
        ["--trials", "1", "--jobs", "8", "--seed", "3", "--kubeconfig", str(kube_cluster.kubeconfig),
         "--log-dir", str(tmp_path)]
    )  # fmt: skip
    summary = _summary(capsys.readouterr().out)
    assert summary["sigkills"] >= 2 and summary["jobs"] >= 8, summary
    assert code == 0 and summary["problems"] == [], summary


@pytest.mark.cluster
def test_seeded_fuzz_bursts_on_two_workers_are_judged_and_survived(
    kube_cluster, crd_installed, tmp_path, capsys
) -> None:
    out = tmp_path / "fuzz.jsonl"
    code = fuzz.main(
        ["--manifests", "120", "--burst", "60", "--seed", "5", "--workers", "2",
         "--kubeconfig", str(kube_cluster.kubeconfig), "--log-dir", str(tmp_path), "--out", str(out)]
    )  # fmt: skip
    printed = capsys.readouterr().out
    summary = _summary(printed)
    assert summary["manifests"] == 120 and summary["accepted"] > 0 and summary["refused"] > 0, summary
    assert summary["workers"] == 2 and summary["host"]["cpu_count"], summary
    assert code == 0 and summary["passed"], summary
    lines = [json.loads(line) for line in printed[: printed.index("\n{\n")].splitlines()]
    assert sorted(r["burst"] for r in lines) == [0, 1] and {r["seed"] for r in lines} == {5000, 5001}, lines
    assert out.read_text().strip() == printed.strip()


def test_numbers_are_taken_once_each_in_order_whatever_the_worker_count() -> None:
    """Each trial or burst number runs exactly once, on whichever worker is free; the results come
    back in number order; with 3 workers, 3 run at once."""
    running, most = [0], [0]
    lock = threading.Lock()
    seen: list[int] = []

    def work(worker: int, number: int) -> tuple[int, int]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        deadline = time.monotonic() + 5
        while most[0] < 3 and time.monotonic() < deadline:  # wait for the others to be running too
            time.sleep(0.01)
        with lock:
            running[0] -= 1
        return number, worker

    results = run_numbered(9, 3, None, time.monotonic(), work, lambda r: seen.append(r[0]))
    assert [n for n, _ in results] == list(range(9)) and sorted(seen) == list(range(9))
    assert most[0] == 3 and {w for _, w in results} <= {0, 1, 2}


def test_no_number_starts_after_the_time_budget_and_a_run_can_go_on() -> None:
    started = time.monotonic() - 10  # the budget of 5 s is spent already
    assert run_numbered(4, 2, 5.0, started, lambda w, n: n, lambda r: None) == []
    assert run_numbered(4, 2, 60.0, started, lambda w, n: n, lambda r: None) == [0, 1, 2, 3]
    assert run_numbered(4, 2, None, started, lambda w, n: n, lambda r: None, first=2) == [2, 3]


def test_a_fuzz_burst_depends_on_the_seed_and_its_number_only() -> None:
    first = fuzz.burst_manifests(7, 3, 50, 200)
    assert first == fuzz.burst_manifests(7, 3, 50, 200)
    assert [m["metadata"]["name"] for m in first] == [f"f{i}" for i in range(150, 200)]
    assert [m.get("spec") for m in first] != [m.get("spec") for m in fuzz.burst_manifests(7, 2, 50, 200)]
    assert [m.get("spec") for m in first] != [m.get("spec") for m in fuzz.burst_manifests(8, 3, 50, 200)]
    assert len(fuzz.burst_manifests(7, 3, 50, 180)) == 30  # the last burst takes what is left
