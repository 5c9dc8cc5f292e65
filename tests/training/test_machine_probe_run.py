"""The machine probe runs end to end on CPU: both memory passes, the CPU loop around them, a JSON file."""

from __future__ import annotations

import json

from bench import machine_probe


def test_probe_writes_both_passes_and_the_host(tmp_path, capsys):
    assert machine_probe.main(["--out", str(tmp_path), "--touch-gib", "1", "--chunk-gib", "1"]) == 0
    result = json.loads((tmp_path / "machine_probe.json").read_text())
    memory = result["memory"]
    assert memory["chunks"] == 1
    assert memory["first_pass_gib_s"]["n"] == 1 and memory["second_pass_gib_s"]["n"] == 1
    assert memory["first_pass_gib_s"]["median"] > 0 and memory["second_pass_gib_s"]["median"] > 0
    assert result["before"]["cpu_loop_s"] > 0 and result["after"]["cpu_loop_s"] > 0
    assert result["host"]["cpu_count"] >= 1 and "measured_code" in result["host"]
    assert "first pass" in capsys.readouterr().out


def test_no_warm_up_measures_one_chunk_once(tmp_path):
    assert machine_probe.main(["--out", str(tmp_path), "--chunk-gib", "1", "--no-warm-up"]) == 0
    memory = json.loads((tmp_path / "machine_probe.json").read_text())["memory"]
    assert memory["chunks"] == 1 and memory["second_pass_gib_s"] == {}


def test_a_bad_size_is_refused_naming_the_option(tmp_path, capsys):
    assert machine_probe.main(["--out", str(tmp_path), "--touch-gib", "lots"]) == 2
    assert "--touch-gib" in capsys.readouterr().err
    assert not (tmp_path / "machine_probe.json").exists()
