"""Conditions are always written whole and in the metav1.Condition shape the CRD requires."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from colocgrpo_operator.api.model import CONDITION_REASON_PATTERN, Condition
from colocgrpo_operator.controller.conditions import condition_reason, set_condition

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "written"),
    [
        ("OOMKilled", "OOMKilled"),
        ("Reason_With,Colons:ok", "Reason_With,Colons:ok"),
        ("exit code 137 (OOM)", "exitcode137OOM"),
        ("137Killed", "Killed"),
        ("Trailing:", "Trailing"),
        ("", "Unknown"),
        ("!!!", "Unknown"),
        ("A" * 2000, "A" * 1024),
    ],
)
def test_reason_is_made_acceptable(raw, written):
    assert condition_reason(raw) == written


@given(st.text(max_size=1500))
def test_any_reason_becomes_one_the_crd_accepts(raw):
    reason = condition_reason(raw)
    assert re.match(CONDITION_REASON_PATTERN, reason) and len(reason) <= 1024


def test_set_condition_writes_every_required_field_and_keeps_one_per_type():
    conditions = set_condition([{"type": "Running", "status": "True"}], "Running", True, "AllWorkersRunning", None, NOW)
    (running,) = conditions
    Condition.model_validate(running)  # type, status, reason, message, lastTransitionTime all present
    assert running["message"] == "" and running["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    # The same status again keeps the transition time; a flip moves it.
    later = NOW + timedelta(minutes=5)
    assert set_condition(conditions, "Running", True, "Finishing", "", later)[0]["lastTransitionTime"] == (
        "2026-01-01T00:00:00Z"
    )
    assert set_condition(conditions, "Running", False, "Restarting", "", later)[0]["lastTransitionTime"] == (
        "2026-01-01T00:05:00Z"
    )
