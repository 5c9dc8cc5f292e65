"""The headline table from several pair runs (bench/grpo_step.py --pair ..., one bench.json each).

    python3 -m bench.pair_table RUN.json [RUN.json ...] [--machine RUN.json=LABEL ...] [--json OUT]

Every run is reported (no best-of): each TRL contender of a run forms one pair with that run's ours
contender, and every pair is a row with its pair index and run order, machine, host CPU, GPU,
commit, ours' and TRL's median s/step, their ratio and ours ÷ the floor printed in the same run.
Then per TRL configuration (trl-sleep under plain ZeRO-3, under the one-GPU file, without
DeepSpeed): the median ratio over its pairs with the min–max, overall and per machine. TRL's best
configuration is the one of the two DeepSpeed ones (`@plain`, `@product`) with the lower median
s/step over its pairs; `@none` (no DeepSpeed) is shown beside it as a reference. Last, the verdict
on each target of issue #21 (`TARGETS`), overall and on every machine. A run that is incomplete (a
contender skipped, failed or timed out) is listed, and the pairs it did measure still count; the
table then exits 1.

A machine is told apart by the boot id the bench records (`host.boot_id`; every lent GPU machine
has the host name `vm`); runs recorded before that field existed take a label from `--machine`.
Pairs count as one series when they measured the same code: the git objects of `MEASURED_CODE` as the
run found them (`host.measured_code`), or for runs recorded before that field, at the run's commit,
looked up in this checkout. Runs before 2e9977d recorded the whole renderer folder in place of its
DeepSpeed file (`MEASURED_CODE_BEFORE_2E9977D`): their series is closed, and the renderer's other
modules (the pod, the Service) do not run in a step.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# TRL configurations that may be its denominator; `@none` is a reference only.
DENOMINATOR_FILES = ("plain", "product")
# What a GRPO step of ours runs: the trainer (a tree) and the module that renders its DeepSpeed and
# accelerate files (a blob).
MEASURED_CODE = ("training", "operator/colocgrpo_operator/render/launch_config.py")
MEASURED_CODE_BEFORE_2E9977D = ("training", "operator/colocgrpo_operator/render")
# Issue #21's targets: (what, statistic, limit). `plain` is trl-sleep under plain ZeRO-3; `best` is
# TRL's best measured DeepSpeed configuration; `floor` is ours ÷ the floor printed in the same run.
TARGETS = (
    ("ours ÷ trl-sleep@plain, median", "plain", "median", 0.50),
    ("ours ÷ trl-sleep@plain, worst pair", "plain", "max", 0.60),
    ("ours ÷ TRL's best, median", "best", "median", 0.70),
    ("ours ÷ TRL's best, worst pair", "best", "max", 0.80),
    ("ours ÷ floor, worst run", "floor", "max", 4.0),
)
MIN_PAIRS = 3


def trl_file(contender: str) -> str:
    return contender.partition("@")[2] or "plain"


@functools.cache  # one lookup per commit, not one per pair
def measured_code(commit: str, repo: Path = REPO, paths: tuple[str, ...] = MEASURED_CODE) -> str:
    """The git objects of `paths` at `commit`, shortened; '?' where this checkout lacks it."""
    trees = []
    for path in paths:
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", f"{commit}:{path}"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return "?"
        if out.returncode != 0:
            return "?"
        trees.append(out.stdout.strip()[:8])
    return "+".join(trees)


def working_tree_code(repo: Path = REPO) -> str:
    """`measured_code` of the files as they are in `repo` (what a run executes), through a scratch index:
    equal to `measured_code(commit)` when they match that commit. A GPU machine's copy of the checkout
    can carry a newer tree than its git HEAD says."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(scratch) / "index"))
        trees = []
        try:
            for args in (["read-tree", "HEAD"], ["add", "-A", "--", *MEASURED_CODE]):
                subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, timeout=60, check=True)
            for path in MEASURED_CODE:
                # A folder: its tree, written from the scratch index; a file: its blob, staged there.
                folder = (repo / path).is_dir()
                args = ["write-tree", f"--prefix={path}/"] if folder else ["ls-files", "--stage", "--", path]
                out = subprocess.run(
                    ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, timeout=60, check=True
                )
                object_id = out.stdout.strip() if folder else out.stdout.split()[1]
                trees.append(object_id[:8])
        except (OSError, subprocess.SubprocessError):
            return "?"
    return "+".join(trees)


def pair_rows(runs: list[tuple[str, dict]], machines: dict[str, str] | None = None) -> tuple[list[dict], list[str]]:
    """One row per measured TRL contender of every run whose one ours contender was measured (a run of
    ours and two TRL configurations gives two pairs), and what was not measured. A contender skipped or
    failed in a run is named, and the pairs the run did measure still count: leaving them out would
    choose which measurements to report."""
    rows, left_out = [], []
    for name, run in runs:
        results = run.get("results", [])
        if run.get("incomplete"):
            left_out.append(f"{name}: incomplete ({'; '.join(run['incomplete'])})")
        ours = [r for r in results if r["contender"].startswith("ours-")]
        trl = [r for r in results if r["contender"].startswith("trl-") and "median_s_per_step" in r]
        if len(ours) != 1 or "median_s_per_step" not in ours[0] or not trl:
            left_out.append(f"{name}: no measured pair ({[r['contender'] for r in results]})")
            continue
        host = run.get("host", {})
        machine = (machines or {}).get(name) or host.get("boot_id") or host.get("hostname", "?")
        order = ",".join(run.get("contenders_in_run_order") or [r["contender"] for r in results])
        floor = run.get("floor", {}).get("floor_s_per_step")
        commit = str(host.get("commit", "?"))
        o = ours[0]
        for t in trl:
            rows.append(
                {
                    "run": name,
                    "pair_index": run.get("pair_index"),
                    "order": order,
                    "machine": str(machine)[:12],
                    "cpu": host.get("cpu_model", "?"),
                    "gpu": host.get("gpu", "?"),
                    "commit": commit[:12],
                    # Runs without the field predate it, and 2e9977d: the folder's tree then.
                    "code": host.get("measured_code")
                    or (measured_code(commit, paths=MEASURED_CODE_BEFORE_2E9977D) if commit != "?" else "?"),
                    "ours": o["contender"],
                    "ours_s": o["median_s_per_step"],
                    "trl": t["contender"],
                    "trl_file": trl_file(t["contender"]),
                    "trl_s": t["median_s_per_step"],
                    "ratio": o["median_s_per_step"] / t["median_s_per_step"],
                    "ours_over_floor": o["median_s_per_step"] / floor if floor else None,
                }
            )
    return rows, left_out


def spread(values: list[float], unit: str = "pairs") -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f}, {len(values)} {unit})"


def verdicts(rows: list[dict], best: str | None) -> tuple[list[str], list[dict]]:
    """Each target of `TARGETS` over all pairs (met only with `MIN_PAIRS` pairs) and on every machine."""
    lines, found = ["", "| target | scope | value | limit | pairs | verdict |", "|---|---|---|---|---|---|"], []
    machines = sorted({r["machine"] for r in rows})
    for what, against, statistic, limit in TARGETS:
        for scope in ["all", *machines]:
            mine = [r for r in rows if scope in ("all", r["machine"])]
            if against == "floor":
                per_run = {r["run"]: r["ours_over_floor"] for r in mine if r["ours_over_floor"] is not None}
                values = list(per_run.values())
            else:
                file = best if against == "best" else "plain"
                values = [r["ratio"] for r in mine if r["trl_file"] == file]
            if not values:
                continue
            value = statistics.median(values) if statistic == "median" else max(values)
            # The median and worst pair over all pairs need MIN_PAIRS; each machine's pairs must meet
            # the same limits however few they are ("on every machine the pairs ran on").
            enough = against == "floor" or scope != "all" or len(values) >= MIN_PAIRS
            verdict = ("met" if value <= limit else "MISSED") if enough else f"too few pairs (< {MIN_PAIRS})"
            found.append({"target": what, "scope": scope, "value": value, "limit": limit, "verdict": verdict})
            lines.append(f"| {what} | {scope} | {value:.3f} | {limit:.2f} | {len(values)} | {verdict} |")
    return lines, found


def table(rows: list[dict], left_out: list[str]) -> tuple[list[str], dict]:
    lines = [
        "| run | pair index | run order | machine | host CPU | GPU | commit | ours s/step | TRL | TRL s/step "
        "| ratio | ours ÷ floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = "" if r["ours_over_floor"] is None else f"{r['ours_over_floor']:.2f}"
        lines.append(
            f"| {r['run']} | {r['pair_index']} | {r['order']} | {r['machine']} | {r['cpu']} | {r['gpu']} "
            f"| {r['commit']} | {r['ours_s']:.3f} | {r['trl']} | {r['trl_s']:.3f} | {r['ratio']:.3f} | {floor} |"
        )
    summary: dict = {
        "configurations": {},
        "commits": sorted({r["commit"] for r in rows}),
        "measured_code": sorted({r["code"] for r in rows}),
        "left_out": left_out,
    }
    lines += [
        "",
        "| TRL configuration | TRL median s/step | ratio: median (min–max) | per machine |",
        "|---|---|---|---|",
    ]
    for file in sorted({r["trl_file"] for r in rows}):
        mine = [r for r in rows if r["trl_file"] == file]
        machines = sorted({r["machine"] for r in mine})
        per_machine = {m: [r["ratio"] for r in mine if r["machine"] == m] for m in machines}
        trl_median = statistics.median(r["trl_s"] for r in mine)
        summary["configurations"][file] = {
            "pairs": len(mine),
            "trl_median_s": trl_median,
            "ratio_median": statistics.median(r["ratio"] for r in mine),
            "ratio_min": min(r["ratio"] for r in mine),
            "ratio_max": max(r["ratio"] for r in mine),
            "machines": {m: statistics.median(v) for m, v in per_machine.items()},
        }
        lines.append(
            f"| trl-sleep@{file} | {trl_median:.3f} | {spread([r['ratio'] for r in mine])} "
            f"| {'; '.join(f'{m}: {spread(v)}' for m, v in per_machine.items())} |"
        )
    candidates = {f: c for f, c in summary["configurations"].items() if f in DENOMINATOR_FILES}
    best = None
    if candidates:
        best = min(candidates, key=lambda f: candidates[f]["trl_median_s"])
        summary["trl_best"] = best
        lines.append(
            f"\nTRL's best measured configuration: trl-sleep@{best} (median {candidates[best]['trl_median_s']:.3f} "
            f"s/step; of {', '.join(sorted(candidates))}). "
            "`@none` (no DeepSpeed) is a reference, never the denominator."
        )
    per_run_floor = {r["run"]: r["ours_over_floor"] for r in rows if r["ours_over_floor"] is not None}
    if per_run_floor:
        lines.append(f"ours ÷ floor: {spread(list(per_run_floor.values()), 'runs')}")
    target_lines, summary["targets"] = verdicts(rows, best)
    lines += target_lines
    if len(summary["measured_code"]) > 1:
        lines.append(
            f"WARNING: the pairs measured {len(summary['measured_code'])} versions of the trainer's code "
            f"(git objects of {' and '.join(MEASURED_CODE)}, or before 2e9977d of "
            f"{' and '.join(MEASURED_CODE_BEFORE_2E9977D)}): {', '.join(summary['measured_code'])}"
        )
    elif len(summary["commits"]) > 1:
        lines.append(
            f"The pairs ran on {len(summary['commits'])} commits ({', '.join(summary['commits'])}) with the same "
            f"trainer code (git objects {summary['measured_code'][0]})."
        )
    lines += [f"LEFT OUT: {line}" for line in left_out]
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path, help="bench.json of pair runs")
    parser.add_argument(
        "--machine",
        action="append",
        default=[],
        metavar="RUN=LABEL",
        help="the machine of a run recorded without a boot id (RUN is the file's name)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and statistics here")
    args = parser.parse_args(argv)
    machines = dict(m.split("=", 1) for m in args.machine)
    runs = [(path.name, json.loads(path.read_text())) for path in args.runs]
    rows, left_out = pair_rows(runs, machines)
    lines, summary = table(rows, left_out)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"pairs": rows, **summary}, indent=2))
    return 0 if rows and not left_out else 1


if __name__ == "__main__":
    sys.exit(main())
