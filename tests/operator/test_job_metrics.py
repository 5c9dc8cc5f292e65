"""Per-job metrics: one sample per job from its status, gone with the job, and the Grafana dashboard's every query
selecting series that a running operator really serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from colocgrpo_operator.metrics import JOB_SERIES, JobMetrics, sample_of
from support.operator_harness import condition, tiny_job, wait_for
from support.promql import matching, scraped_samples, selectors

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "colocgrpo-operator" / "dashboards" / "colocgrpo-jobs.json"

# What the trainer reports (training/colocgrpo_training/progress.py), as it would after a few steps with vLLM.
PROGRESS = {
    "step": 6,
    "maxSteps": 20,
    "percent": 30,
    "estimatedRemainingSeconds": 42,
    "metrics": {
        "reward": 0.375,
        "step_time_seconds": 3.0,
        "sleep_seconds_total": 1.5,
        "wake_seconds_total": 2.25,
        "push_seconds_total": 0.5,
        "generate_seconds_total": 9.0,
    },
    "rewardHistory": [0.125, 0.25, 0.375],
    "lastUpdateTime": "2026-01-01T00:00:00Z",
}


def _exposition(metrics: JobMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_samples_come_from_the_status_and_go_with_the_job():
    metrics = JobMetrics()
    metrics.observe(("team-a", "run"), {"restarts": 2, "workers": {"gpus": 8}, "progress": PROGRESS})
    # A trainer may write anything into progress: what is not a number is left out, never exported.
    metrics.observe(("team-b", "odd"), {"restarts": "many", "progress": {"step": True, "metrics": {"reward": "hi"}}})
    metrics.observe(("team-c", "new"), None)
    text = _exposition(metrics)
    assert 'colocgrpo_job_reward{job_name="run",namespace="team-a"} 0.375' in text
    assert 'colocgrpo_job_restarts_total{job_name="run",namespace="team-a"} 2.0' in text
    assert 'colocgrpo_job_sleep_seconds_total{job_name="run",namespace="team-a"} 1.5' in text
    assert 'colocgrpo_job_gpus{job_name="run",namespace="team-a"} 8.0' in text
    assert 'job_name="odd"' not in text and 'job_name="new"' not in text
    assert sample_of({"progress": []}) == sample_of(None)
    metrics.forget(("team-a", "run"))
    assert 'job_name="run"' not in _exposition(metrics)
    assert len(metrics) == 2


def test_every_series_has_one_prefix_and_only_the_two_bounded_labels():
    metrics = JobMetrics()
    metrics.observe(("ns", "job"), {"restarts": 0, "workers": {"gpus": 0}, "progress": PROGRESS})
    samples = scraped_samples(_exposition(metrics))
    assert {name for name, _, _ in samples} == {
        name + ("_total" if counter else "") for _, name, _, counter in JOB_SERIES
    }
    assert all(labels.keys() == {"namespace", "job_name"} for _, labels, _ in samples)


def _dashboard_queries(namespace: str, job: str) -> list[str]:
    """Every PromQL query of the dashboard (panel targets and the variables' label_values selectors), with the
    variables set to this job the way Grafana substitutes them."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert inner, variable["definition"]
            queries.append(inner.group(1))
    # Namespaces and job names are DNS labels: as regexes they match themselves.
    values = {"$namespace": namespace, "$job": job, "$__rate_interval": "1m"}
    return [re.sub(r"\$namespace|\$job|\$__rate_interval", lambda m: values[m.group(0)], q) for q in queries]


@pytest.mark.cluster
def test_every_dashboard_query_selects_series_of_a_running_job(cluster, operator, op_namespace):
    ns, name = op_namespace, "metered"
    cluster.create_job(ns, tiny_job(name))
    wait_for(
        lambda: condition(cluster.get_job(ns, name), "Running").get("status") == "True",
        60,
        f"{ns}/{name} running",
        on_timeout=operator.log_tail,
    )
    cluster.patch_job(ns, name, {"status": {"progress": PROGRESS}}, subresource="status")

    def ours(samples):
        return [s for s in samples if s[1].get("namespace") == ns and s[1].get("job_name") == name]

    samples = wait_for(
        lambda: (
            (scraped := scraped_samples(operator.metrics()))
            and any(n == "colocgrpo_job_reward" for n, _, _ in ours(scraped))
            and scraped
        ),
        30,
        "the job's reward on /metrics",
        on_timeout=operator.log_tail,
    )
    values = {n: v for n, _, v in ours(samples)}
    assert values["colocgrpo_job_reward"] == 0.375 and values["colocgrpo_job_step"] == 6
    assert values["colocgrpo_job_push_seconds_total"] == 0.5 and values["colocgrpo_job_restarts_total"] == 0
    assert any(n == "colocgrpo_build_info" for n, _, _ in samples)
    assert not [n for n, _, _ in samples if not n.startswith(("colocgrpo_", "process_", "python_"))]

    unmatched = []
    for parsed in selectors(_dashboard_queries(ns, name)):
        assert not parsed.get("error"), parsed
        assert parsed["selectors"], parsed["expr"]
        unmatched += [(parsed["expr"], sel) for sel in parsed["selectors"] if not matching(sel, samples)]
    assert not unmatched, f"dashboard selectors with no series: {unmatched}"

    # The job's series leave with the job.
    cluster.delete_job(ns, name)
    wait_for(lambda: not ours(scraped_samples(operator.metrics())), 30, "the job's series to go")
