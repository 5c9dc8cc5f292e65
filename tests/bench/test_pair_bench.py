"""The GRPO pair bench cannot report a partial run as a result, alternates its pair's order, records
the host, and the pair table reports every pair against TRL's best measured configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import pair_table
from bench.grpo import contenders, run, sizes


def test_pair_order_alternates_with_the_index():
    pair = ["ours-auto", "trl-sleep"]
    assert [contenders.pair_order(pair, k) for k in range(3)] == [pair, pair[::-1], pair]
    args = run.parse_args(["--out", "x", "--pair", "ours-auto,trl-sleep@product", "--pair-index", "3"])
    assert args.contenders == ["trl-sleep@product", "ours-auto"]
    with pytest.raises(SystemExit):
        run.parse_args(["--out", "x", "--pair", "ours-auto"])


def test_three_contenders_rotate_through_every_position():
    three = ["ours-auto", "trl-sleep", "trl-sleep@product"]
    orders = [contenders.pair_order(three, k) for k in range(4)]
    assert orders[0] == three and orders[3] == three
    assert orders[1] == ["trl-sleep", "trl-sleep@product", "ours-auto"]
    # Over three runs each contender stands once in each position.
    assert all(sorted(o[pos] for o in orders[:3]) == sorted(three) for pos in range(3))
    args = run.parse_args(["--out", "x", "--pair", ",".join(three), "--pair-index", "2"])
    assert args.contenders == ["trl-sleep@product", "ours-auto", "trl-sleep"]


@pytest.mark.parametrize(
    "pair", ["trl-sleep,trl-sleep@product", "ours-auto,ours-level1,trl-sleep", "ours-auto,trl-sleep,trl-sleep"]
)
def test_a_pair_needs_one_ours_and_distinct_trl_contenders(pair):
    with pytest.raises(SystemExit):
        run.parse_args(["--out", "x", "--pair", pair])


def test_trl_without_deepspeed_is_a_contender():
    assert contenders.check_contender("trl-sleep@none") == "trl-sleep@none"
    assert contenders.deepspeed_file_key("trl-sleep@none") == "none"
    kwargs = contenders.grpo_kwargs("trl-sleep@none", Path("out"), 3, cpu=True, config=sizes.SIZES["cpu"])
    assert kwargs["ddp_backend"] is None


@pytest.mark.parametrize("contender", ["trl-sleep", "trl-sleep@plain", "trl-sleep@product", "trl-sleep@none"])
def test_trl_sleep_sleeps_under_every_deepspeed_file(contender):
    kwargs = contenders.grpo_kwargs(contender, Path("out"), 3, config=sizes.SIZES["large"], util=0.17)
    assert kwargs["vllm_enable_sleep_mode"] is True
    assert contenders.grpo_kwargs("trl-nosleep@product", Path("out"), 3)["vllm_enable_sleep_mode"] is False


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """bench.grpo.run.main with every contender's launch replaced: `outcomes` says what each one does."""
    monkeypatch.setattr(run, "MODEL", str(tmp_path))
    monkeypatch.setattr(run, "install_stop_handlers", lambda: None)
    outcomes: dict[str, str] = {}
    launched: list[str] = []

    def run_child(cmd, env, work, timeout):
        if "--make-model" in cmd:
            (work / "model.json").write_text(json.dumps({"shape": "test", "params": 10, "path": str(tmp_path)}))
            return 0, False
        contender = cmd[cmd.index("--worker") + 1]
        util = cmd[cmd.index("--util") + 1] if "--util" in cmd else None
        launched.append(contender if util is None else f"{contender}:{util}")
        (work / "stderr.log").write_text("the child's log\n")
        if outcomes[contender] == "timeout":
            return 124, True
        if outcomes[contender] == "oom" and util == "0.17":
            (work / "stderr.log").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
            return 1, False
        (work / "result.json").write_text(
            json.dumps(
                {
                    "contender": contender.partition("@")[0],
                    "median_s_per_step": 1.0,
                    "warmup_steps": 1,
                    "step_times": [1.0, 1.0],
                    "breakdown_total_seconds": {},
                    "params": 10,
                    "gpu_memory_utilization": None if util is None else float(util),
                }
            )
        )
        return 0, False

    monkeypatch.setattr(run, "run_child", run_child)
    return outcomes, launched


def test_a_contender_that_timed_out_fails_the_run(fake_bench, tmp_path):
    outcomes, launched = fake_bench
    outcomes.update({"ours-auto": "ok", "trl-sleep@product": "timeout"})
    out = tmp_path / "out"
    code = run.main(
        ["--out", str(out), "--cpu", "--size", "cpu", "--pair", "ours-auto,trl-sleep@product", "--pair-index", "1"]
    )
    assert code == 1 and launched == ["trl-sleep@product", "ours-auto"]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["incomplete"] == ["trl-sleep@product: timed out after 200 s"]
    assert (bench["pair"], bench["pair_index"]) == (["ours-auto", "trl-sleep@product"], 1)
    assert bench["contenders_in_run_order"] == ["trl-sleep@product", "ours-auto"]
    assert {"cpu_model", "gpu", "commit", "hostname"} <= set(bench["host"])
    assert bench["results"][1]["contender"] == "ours-auto"
    assert "NOT MEASURED: trl-sleep@product: timed out" in (out / "bench.md").read_text()


def test_a_contender_skipped_for_time_fails_the_run(fake_bench, tmp_path):
    outcomes, launched = fake_bench
    outcomes.update({"ours-auto": "ok", "trl-sleep": "ok"})
    code = run.main(
        [
            "--out",
            str(tmp_path / "out"),
            "--cpu",
            "--size",
            "cpu",
            "--contenders",
            "ours-auto,trl-sleep",
            "--budget-seconds",
            "0",
        ]
    )
    assert code == 1 and launched == []
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert bench["incomplete"] == ["ours-auto: skipped (time budget)", "trl-sleep: skipped (time budget)"]


def test_a_complete_pair_passes(fake_bench, tmp_path):
    outcomes, _ = fake_bench
    outcomes.update({"ours-auto": "ok", "trl-sleep": "ok"})
    code = run.main(["--out", str(tmp_path / "out"), "--cpu", "--size", "cpu", "--pair", "ours-auto,trl-sleep"])
    assert code == 0
    results = json.loads((tmp_path / "out" / "bench.json").read_text())["results"]
    assert [r["contender"] for r in results] == ["ours-auto", "trl-sleep"]


def test_one_contender_out_of_memory_lowers_no_others_utilization(fake_bench, tmp_path):
    outcomes, launched = fake_bench
    outcomes.update({"ours-auto": "ok", "trl-sleep@product": "oom"})
    out = tmp_path / "out"
    args = ["--out", str(out), "--cpu", "--size", "large", "--util-ladder", "0.17,0.14"]
    code = run.main([*args, "--pair", "trl-sleep@product,ours-auto"])
    assert code == 0
    # TRL under the one-GPU file ran at the next utilization; ours, after it, still at the highest.
    assert launched == ["trl-sleep@product:0.17", "trl-sleep@product:0.14", "ours-auto:0.17"]
    results = json.loads((out / "bench.json").read_text())["results"]
    assert [r["gpu_memory_utilization"] for r in results] == [0.14, 0.17]
    assert results[0]["failed_attempts"][0]["status"].endswith("(out of memory)")


def run_file(path: Path, index: int, machine: str, trl: str, ours_s: float, trl_s: float, incomplete=()) -> Path:
    path.write_text(
        json.dumps(
            {
                "pair_index": index,
                "contenders_in_run_order": ["ours-auto", trl] if index % 2 == 0 else [trl, "ours-auto"],
                "host": {"hostname": machine, "cpu_model": f"cpu of {machine}", "gpu": "H200", "commit": "abc"},
                "floor": {"floor_s_per_step": 0.5},
                "incomplete": list(incomplete),
                "results": [
                    {"contender": "ours-auto", "median_s_per_step": ours_s},
                    {"contender": trl, "median_s_per_step": trl_s},
                ],
            }
        )
    )
    return path


def test_the_pair_table_reports_every_pair_and_trls_best(tmp_path, capsys):
    files = [
        run_file(tmp_path / "a.json", 0, "m1", "trl-sleep", 2.0, 5.0),
        run_file(tmp_path / "b.json", 1, "m1", "trl-sleep", 2.0, 4.0),
        run_file(tmp_path / "c.json", 2, "m2", "trl-sleep", 2.0, 8.0),
        run_file(tmp_path / "d.json", 0, "m2", "trl-sleep@product", 2.0, 3.0),
        run_file(tmp_path / "e.json", 0, "m2", "trl-sleep@none", 2.0, 2.5),
    ]
    assert pair_table.main([str(f) for f in files] + ["--json", str(tmp_path / "t.json")]) == 0
    summary = json.loads((tmp_path / "t.json").read_text())
    plain = summary["configurations"]["trl-sleep@plain"]
    assert plain["pairs"] == 3 and plain["ratio_median"] == pytest.approx(0.4)
    assert (plain["ratio_min"], plain["ratio_max"]) == (pytest.approx(0.25), pytest.approx(0.5))
    assert plain["machines"] == {"m1": pytest.approx((0.4 + 0.5) / 2), "m2": pytest.approx(0.25)}
    # TRL's best in each run: its fastest contender with fp32 master weights; e.json has only TRL without
    # DeepSpeed (faster, yet a reference), so no best.
    best = summary["trl_best"]
    assert best["chosen"] == {"trl-sleep@plain": 3, "trl-sleep@product": 1}
    assert best["pairs"] == 4 and best["ratio_median"] == pytest.approx((0.4 + 0.5) / 2)
    assert [p["run"] for p in summary["pairs"] if p["trl_best"]] == ["a.json", "b.json", "c.json", "d.json"]
    out = capsys.readouterr().out
    assert "| a.json | 0 | ours-auto,trl-sleep | m1 | cpu of m1 |" in out  # every pair, in its run order
    assert "| b.json | 1 | trl-sleep,ours-auto | m1 |" in out
    assert out.count(".json | ") == 5
    assert "ours ÷ floor: 4.000 (4.000–4.000, 5 runs)" in out
    # The large size's targets: against TRL's best in each run and against the floor, overall and per machine.
    assert "| ours ÷ TRL's best, median | all | 0.450 | 0.90 | 4 | met |" in out
    assert "| ours ÷ TRL's best, median | m2 | 0.458 | 0.90 | 2 | met |" in out
    assert "| ours ÷ floor, median | all | 4.000 | 2.80 | 5 | MISSED |" in out
    assert "trl-sleep@plain, median |" not in out  # a configuration's pairs are tabulated, not judged


def test_an_incomplete_run_is_listed_its_measured_pairs_count_and_the_table_fails(tmp_path, capsys):
    skipped = "trl-sleep@product: skipped (time budget)"
    b = run_file(tmp_path / "b.json", 1, "m1", "trl-sleep", 2.0, 4.0, incomplete=[skipped])
    run = json.loads(b.read_text())
    run["results"].append({"contender": "trl-sleep@product", "status": "skipped (time budget)"})
    b.write_text(json.dumps(run))
    c = run_file(tmp_path / "c.json", 0, "m1", "trl-sleep", 2.0, 4.0, incomplete=["ours-auto: failed (rc 1)"])
    run = json.loads(c.read_text())
    run["results"][0] = {"contender": "ours-auto", "status": "failed (rc 1)"}
    c.write_text(json.dumps(run))
    files = [run_file(tmp_path / "a.json", 0, "m1", "trl-sleep", 2.0, 5.0), b, c]
    assert pair_table.main([str(f) for f in files]) == 1
    out = capsys.readouterr().out
    assert f"LEFT OUT: b.json: incomplete ({skipped})" in out
    # b's measured pair counts (leaving it out would pick what to report); c measured no ours.
    assert "| b.json | 1 |" in out and "2 pairs" in out
    assert "LEFT OUT: c.json: no measured pair" in out and "| c.json |" not in out


def triple_file(path: Path, index: int, ours_s: float, plain_s: float, product_s: float, boot_id: str) -> Path:
    order = contenders.pair_order(["ours-auto", "trl-sleep", "trl-sleep@product"], index)
    times = {"ours-auto": ours_s, "trl-sleep": plain_s, "trl-sleep@product": product_s}
    path.write_text(
        json.dumps(
            {
                "pair_index": index,
                "contenders_in_run_order": order,
                "host": {"hostname": "vm", "boot_id": boot_id, "cpu_model": "x", "gpu": "H200", "commit": "abc"},
                "floor": {"floor_s_per_step": 0.5},
                "incomplete": [],
                "results": [{"contender": c, "median_s_per_step": times[c]} for c in order],
            }
        )
    )
    return path


def test_a_run_of_ours_and_two_trl_files_gives_two_pairs_and_verdicts(tmp_path, capsys):
    files = [
        triple_file(tmp_path / "t0.json", 0, 1.6, 4.5, 3.0, "boot-a"),
        triple_file(tmp_path / "t1.json", 1, 1.8, 5.0, 2.0, "boot-a"),
        triple_file(tmp_path / "t2.json", 2, 2.1, 4.0, 2.5, "boot-b"),
    ]
    old = tmp_path / "old.json"
    old.write_text((tmp_path / "t0.json").read_text().replace('"boot_id": "boot-a", ', ""))
    extra = ["--machine", "old.json=m-old", "--json", str(tmp_path / "s.json")]
    assert pair_table.main([*map(str, files), str(old), *extra]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert len(summary["pairs"]) == 8
    assert {p["machine"] for p in summary["pairs"]} == {"boot-a", "boot-b", "m-old"}
    assert summary["configurations"]["trl-sleep@product"]["pairs"] == 4
    assert summary["trl_best"]["chosen"] == {"trl-sleep@product": 4}
    by = {(t["target"], t["scope"]): t for t in summary["targets"]}
    # Against TRL's best: ratios 1.6/3, 1.8/2, 2.1/2.5, 1.6/3 -> median (0.533 + 0.84) / 2, within 0.90; boot-a's
    # two runs alone give 0.533 and 0.9: median 0.717.
    assert by[("ours ÷ TRL's best, median", "all")]["value"] == pytest.approx((1.6 / 3 + 2.1 / 2.5) / 2)
    assert by[("ours ÷ TRL's best, median", "all")]["verdict"] == "met"
    assert by[("ours ÷ TRL's best, median", "boot-a")]["value"] == pytest.approx((1.6 / 3 + 0.9) / 2)
    assert by[("ours ÷ floor, median", "boot-b")]["value"] == pytest.approx(4.2)
    assert by[("ours ÷ floor, median", "boot-b")]["verdict"] == "MISSED"
    assert "| t1.json | 1 | trl-sleep,trl-sleep@product,ours-auto | boot-a |" in capsys.readouterr().out


def test_the_measured_code_is_the_working_tree_not_head(tmp_path):
    """A GPU machine's copy can hold a newer tree than its HEAD: the run records what it executed."""
    import subprocess

    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(pair_table.REPO), str(repo)], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    clean = pair_table.working_tree_code(repo)
    assert clean == pair_table.measured_code(head, repo) and "?" not in clean
    render = repo / "operator" / "colocgrpo_operator" / "render"
    with (render / "workload.py").open("a") as module:
        module.write("# changed: the pod's spec, not what a step runs\n")
    assert pair_table.working_tree_code(repo) == clean
    with (render / "launch_config.py").open("a") as module:
        module.write("# changed\n")
    (repo / "training" / "new_module.py").write_text("x = 1\n")
    changed = pair_table.working_tree_code(repo)
    assert changed != clean and all(part != old for part, old in zip(changed.split("+"), clean.split("+"), strict=True))
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"], check=True
    )
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert pair_table.measured_code(commit.strip(), repo) == changed  # a commit's objects: the same values


def best_file(path: Path, times: dict[str, float], size: str | None = None, boot_id: str = "boot-a") -> Path:
    """A run of ours-auto and TRL contenders with the given median s/step each."""
    run = {
        "pair_index": 0,
        "contenders_in_run_order": list(times),
        "host": {"hostname": "vm", "boot_id": boot_id, "cpu_model": "x", "gpu": "H200", "commit": "abc"},
        "floor": {"floor_s_per_step": 1.0},
        "incomplete": [],
        "results": [{"contender": c, "median_s_per_step": t} for c, t in times.items()],
    }
    if size is not None:
        run["size"] = size
    path.write_text(json.dumps(run))
    return path


def test_trls_best_is_the_fastest_fp32_contender_of_each_run(tmp_path, capsys):
    files = [
        # trl-best under TRL's file beats it under ours here, and TRL without DeepSpeed is faster yet: a reference.
        best_file(
            tmp_path / "r0.json", {"ours-auto": 1.0, "trl-best@plain": 2.0, "trl-best": 2.5, "trl-sleep@none": 1.5}
        ),
        # and the other way round in the next run.
        best_file(tmp_path / "r1.json", {"ours-auto": 1.2, "trl-best@plain": 3.0, "trl-best@product": 2.4}),
        best_file(tmp_path / "r2.json", {"ours-auto": 1.1, "trl-sleep": 4.0, "trl-best": 2.2}, boot_id="boot-b"),
    ]
    assert pair_table.main([*map(str, files), "--json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    best = {p["run"]: p["trl"] for p in summary["pairs"] if p["trl_best"]}
    assert best == {"r0.json": "trl-best@plain", "r1.json": "trl-best@product", "r2.json": "trl-best"}
    # trl-best without a file is trl-best@product: one configuration with trl-best@product.
    assert summary["trl_best"]["chosen"] == {"trl-best@plain": 1, "trl-best@product": 2}
    assert summary["configurations"]["trl-best@product"]["pairs"] == 3
    assert summary["trl_best"]["ratio_median"] == pytest.approx(0.5)  # 1.0/2.0, 1.2/2.4, 1.1/2.2
    out = capsys.readouterr().out
    assert "Against TRL's best in each run, its fastest configuration there with fp32 master weights: **0.500×**" in out
    assert "as long as TRL's with our merged micro-batch under the operator's one-GPU DeepSpeed file" in out


def test_the_seed_size_has_its_own_targets_and_sizes_are_not_mixed(tmp_path, capsys):
    files = [
        best_file(tmp_path / f"s{k}.json", {"ours-auto": 1.8, "trl-best": 2.0 + k / 10}, size="seed") for k in range(3)
    ]
    assert pair_table.main([*map(str, files), "--json", str(tmp_path / "s.json")]) == 0
    targets = {t["target"]: t for t in json.loads((tmp_path / "s.json").read_text())["targets"] if t["scope"] == "all"}
    assert set(targets) == {"ours ÷ TRL's best, median", "ours ÷ floor, median"}
    assert targets["ours ÷ TRL's best, median"]["limit"] == 0.80
    assert targets["ours ÷ TRL's best, median"]["value"] == pytest.approx(1.8 / 2.1)
    assert targets["ours ÷ TRL's best, median"]["verdict"] == "MISSED"
    assert targets["ours ÷ floor, median"]["limit"] == 1.5
    assert targets["ours ÷ floor, median"]["verdict"] == "MISSED"  # 1.8 of the 1.0 floor
    faster = [best_file(tmp_path / f"f{k}.json", {"ours-auto": 1.4, "trl-best": 2.0}, size="seed") for k in range(2)]
    assert pair_table.main([*map(str, faster), "--json", str(tmp_path / "f.json")]) == 0
    targets = {t["target"]: t for t in json.loads((tmp_path / "f.json").read_text())["targets"] if t["scope"] == "all"}
    assert {t["verdict"] for t in targets.values()} == {"met"}  # 0.70 and 1.4, two pairs being enough
    large = best_file(tmp_path / "l.json", {"ours-auto": 1.0, "trl-sleep": 3.0})  # recorded without a size
    with pytest.raises(SystemExit, match="different sizes \\(large, seed\\)"):
        pair_table.main([*map(str, files), str(large)])
