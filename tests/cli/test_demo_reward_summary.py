"""The demo's closing reward line: the curve read from the trainer's progress lines, and its two ends."""

from __future__ import annotations

import json

from colocgrpo_dev.demo import cpu_millis, reward_curve, reward_summary, training_seconds


def _line(step: int, reward: float | None) -> str:
    metrics = {} if reward is None else {"reward": reward, "loss": 0.1}
    return json.dumps({"progress": {"step": step, "maxSteps": 12, "metrics": metrics}})


def test_reward_curve_keeps_the_last_report_of_each_step_and_skips_other_lines(tmp_path):
    log = tmp_path / "trainer.log"
    bar = " 50%|█████     | 1/2 [00:15<00:15, 15.26s/it]"  # tqdm's bar, which ends with no newline
    lines = ["Loading weights: 100%", _line(0, None), bar + _line(1, 0.25), "{'loss': '0.1'}", _line(2, 0.5)]
    lines += [_line(2, 0.5), '{"progress": {"step": 3, "metrics": {"reward"', _line(3, 0.75)]
    log.write_text("\n".join(lines) + "\n")
    assert reward_curve(log) == [(1, 0.25), (2, 0.5), (3, 0.75)]


def test_reward_summary_averages_five_steps_at_each_end_or_half_of_a_short_run():
    curve = [(step, step / 10) for step in range(1, 13)]
    summary = reward_summary(curve)
    assert summary is not None
    assert (round(summary[0], 6), round(summary[1], 6)) == (0.3, 1.0)
    assert reward_summary([(1, 0.0), (2, 1.0), (3, 0.5)]) == (0.0, 0.5)
    assert reward_summary([(1, 0.5)]) is None


def test_training_time_is_the_jobs_start_to_completion_and_cpu_quantities_read_as_millicores():
    job = {"status": {"startTime": "2026-01-01T00:00:05Z", "completionTime": "2026-01-01T00:01:10Z"}}
    assert training_seconds(job) == 65.0
    assert training_seconds({"status": {"startTime": "2026-01-01T00:00:05Z"}}) == 0.0
    assert [cpu_millis(q) for q in ("2", "1500m", "0.5", "100m")] == [2000, 1500, 500, 100]
