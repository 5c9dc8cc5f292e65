"""The chaos trials and the manifest fuzzer (bench/chaos.py, bench/fuzz.py), seeded and small enough
for every test run (about two minutes together on a loaded 2-core machine); the full runs and their
figures are in docs/benchmarks/chaos.md."""

from __future__ import annotations

import json

import pytest

from bench import chaos, fuzz

pytestmark = pytest.mark.cluster


def _summary(output: str) -> dict:
    return json.loads(output[output.index("\n{\n") :])


def test_seeded_chaos_trial_leaves_nothing_wrong(kube_cluster, crd_installed, tmp_path, capsys) -> None:
    code = chaos.main(
        ["--trials", "1", "--jobs", "8", "--seed", "3", "--kubeconfig", str(kube_cluster.kubeconfig),
         "--log-dir", str(tmp_path)]
    )  # fmt: skip
    summary = _summary(capsys.readouterr().out)
    assert summary["sigkills"] >= 2 and summary["jobs"] >= 8, summary
    assert code == 0 and summary["problems"] == [], summary


def test_seeded_fuzz_burst_is_judged_and_survived(kube_cluster, crd_installed, tmp_path, capsys) -> None:
    code = fuzz.main(
        ["--manifests", "120", "--burst", "60", "--seed", "5", "--kubeconfig", str(kube_cluster.kubeconfig),
         "--log-dir", str(tmp_path)]
    )  # fmt: skip
    summary = _summary(capsys.readouterr().out)
    assert summary["manifests"] == 120 and summary["accepted"] > 0 and summary["refused"] > 0, summary
    assert code == 0 and summary["passed"], summary
