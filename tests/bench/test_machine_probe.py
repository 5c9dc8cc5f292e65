"""The machine probe's plan and summaries (pure); its run on CPU is in tests/training/test_machine_probe_run.py."""

from __future__ import annotations

import pytest

from bench import machine_probe


def test_auto_touches_all_available_memory_but_the_margin():
    assert machine_probe.touch_plan("auto", 4, 120.0) == (120 - machine_probe.HOST_MARGIN_GIB) // 4
    assert machine_probe.touch_plan("10", 4, 120.0) == 2
    assert machine_probe.touch_plan("auto", 4, 3.0) == 1  # never nothing: the probe still measures one chunk


@pytest.mark.parametrize(
    ("touch", "chunk", "field"), [("x", 4, "--touch-gib"), ("-1", 4, "--touch-gib"), ("8", 0, "--chunk-gib")]
)
def test_bad_sizes_name_the_option(touch, chunk, field):
    with pytest.raises(ValueError, match=field):
        machine_probe.touch_plan(touch, chunk, 100.0)


def test_summary_of_rates():
    assert machine_probe.summarize([]) == {}
    assert machine_probe.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
