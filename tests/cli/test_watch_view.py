"""`colocgrpo watch`'s view: progress with percent and time left, the reward's trend as a sparkline."""

from __future__ import annotations

from rich.console import Console

from colocgrpo_operator.cli.watch import SPARK_BLOCKS, _plain_line, render_view, sparkline


def test_sparkline_scales_between_min_and_max():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2, 2, 2]) == "▄▄▄"  # flat: the middle
    assert sparkline([]) == "" and sparkline(None) == "" and sparkline("0.1") == ""
    assert sparkline([0.1, float("nan"), True, "x", 0.3]) == "▁█"  # only finite numbers count
    assert len(sparkline(list(range(100)), width=40)) == 40  # the latest 40
    assert set(sparkline([i / 7 for i in range(8)])) == set(SPARK_BLOCKS)


def _job(progress: dict) -> dict:
    return {
        "metadata": {"name": "demo", "namespace": "ns"},
        "status": {"phase": "Running", "message": "1/1 workers running", "progress": progress},
    }


def test_view_shows_percent_time_left_and_the_reward_trend_beside_the_numbers():
    obj = _job(
        {
            "step": 12,
            "maxSteps": 100,
            "percent": 12,
            "estimatedRemainingSeconds": 273,
            "metrics": {"reward": 0.4},
            "rewardHistory": [0.1, 0.2, 0.3, 0.4],
        }
    )
    console = Console(record=True, width=140)
    console.print(render_view(obj))
    lines = console.export_text().splitlines()
    assert any("step 12/100 (12%, about 4m33s left)" in line for line in lines), lines
    (numbers,) = [line for line in lines if "reward 0.4" in line]
    assert numbers.rstrip().endswith("reward trend ▁▃▆█"), numbers
    assert _plain_line(obj) == "Running  step 12/100 (12%, about 4m33s left)  reward 0.4 ▁▃▆█  1/1 workers running"


def test_view_without_the_new_progress_fields_is_unchanged():
    obj = _job({"step": 5, "maxSteps": 10, "metrics": {"reward": 0.625}})
    console = Console(record=True, width=140)
    console.print(render_view(obj))
    text = console.export_text()
    assert "step 5/10" in text and "(" not in text.split("step 5/10", 1)[1].split("\n", 1)[0]
    assert "trend" not in text
    assert _plain_line(obj) == "Running  step 5/10  reward 0.625  1/1 workers running"
    assert _plain_line({"status": {}}) == "Pending  step -/-  reward -  "
