"""What `get` and `describe` print, from a job's JSON (pure: no cluster; the real kubectl runs them against the
dev cluster in tests/operator/test_kubectl_verbs.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from colocgrpo_operator.cli.describe import describe
from colocgrpo_operator.cli.get import COLUMNS, row
from colocgrpo_operator.cli.output import table
from colocgrpo_operator.client import JobState
from support.operator_harness import tiny_job

NOW = datetime(2026, 1, 1, 0, 10, 0, tzinfo=UTC)


def _state(status=None) -> JobState:
    body = tiny_job("demo", resources={"nodes": 2}, vllm={"tensorParallelSize": 1})  # as stored: defaults filled in
    body["metadata"].update(namespace="team-a", uid="u", creationTimestamp="2026-01-01T00:00:00Z")
    if status is not None:
        body["status"] = status
    return JobState(body)


def test_the_table_is_set_as_kubectls_tab_writer_sets_it():
    text = table([["tiny-cpu", "Succeeded", "1"], ["x", "", "12"]], ["NAME", "PHASE", "NODES"])
    assert text.splitlines() == [
        "NAME       PHASE       NODES",  # each column its widest cell plus 3, at least 6
        "tiny-cpu   Succeeded   1",
        "x                      12",
    ]


def test_a_row_has_kubectls_columns_with_the_step_of_max_steps():
    status = {
        "phase": "Running",
        "restarts": 1,
        "workers": {"gpus": 0},
        "progress": {"step": 7, "maxSteps": 20, "metrics": {"reward": 0.123456}},
        "conditions": [{"type": "Running", "status": "True", "reason": "AllWorkersRunning"}],
    }
    cells = row(_state(status), now=NOW)
    assert dict(zip(COLUMNS, cells, strict=True)) == {
        "NAME": "demo",
        "PHASE": "Running",
        "NODES": "2",
        "GPUS": "0",
        "TP": "1",
        "STEP": "7/20",
        "REWARD": "0.1235",
        "RESTARTS": "1",
        "AGE": "10m",
    }
    assert row(_state(status), now=NOW, namespace=True, wide=True) == ["team-a", *cells, "AllWorkersRunning"]
    assert row(_state(), now=NOW)[1:8] == ["", "2", "", "1", "", "", "0"]  # not seen by the operator yet


def test_describe_of_a_new_job_says_none_where_nothing_is_known():
    text = describe(_state(), events=[], pods=[], plan_lines=[], now=NOW)
    for heading in ("Conditions:", "Last failure:", "Pods:", "Plan:", "Events:"):
        assert f"{heading}\n  <none>" in text, heading
    assert "Phase:      <none yet>" in text and "Progress:   <not reported yet>" in text
    assert "Created:    2026-01-01T00:00:00Z (10m ago)" in text


def test_describe_counts_repeated_events_and_shows_the_plan_indented():
    events = [
        {
            "type": "Warning",
            "reason": "Restarting",
            "message": "restarting the gang",
            "count": 3,
            "firstTimestamp": "2026-01-01T00:01:00Z",
            "lastTimestamp": "2026-01-01T00:09:00Z",
            "source": {"component": "colocgrpo-operator"},
        }
    ]
    text = describe(_state({"phase": "Running"}), events=events, pods=[], plan_lines=["fits", "  detail"], now=NOW)
    assert "Plan:\n  fits\n    detail\n" in text
    (line,) = [line for line in text.splitlines() if "Restarting" in line]
    assert line.split()[:4] == ["Warning", "Restarting", "60s", "(x3"] and "over 9m)" in line
