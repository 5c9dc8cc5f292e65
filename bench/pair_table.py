"""The headline table from several pair runs (bench/grpo_step.py --pair ..., one bench.json each).

    python3 -m bench.pair_table RUN.json [RUN.json ...] [--json OUT]

Every run is reported (no best-of): its pair index and run order, machine (host name), host CPU,
GPU, commit, ours' and TRL's median s/step, their ratio and ours ÷ the floor printed in the same
run. Then per TRL configuration (trl-sleep under plain ZeRO-3, under the one-GPU file, without
DeepSpeed): the median ratio over its pairs with the min–max, overall and per machine. TRL's best
configuration is the one of the two DeepSpeed ones (`@plain`, `@product`) with the lower median
s/step over its pairs; `@none` (no DeepSpeed) is shown beside it as a reference. A run that is
incomplete (a contender skipped, failed or timed out) is listed and counted in no statistic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# TRL configurations that may be its denominator; `@none` is a reference only.
DENOMINATOR_FILES = ("plain", "product")


def trl_file(contender: str) -> str:
    return contender.partition("@")[2] or "plain"


def pair_rows(runs: list[tuple[str, dict]]) -> tuple[list[dict], list[str]]:
    """One row per complete run with one ours and one TRL contender; the reasons others were left out."""
    rows, left_out = [], []
    for name, run in runs:
        results = run.get("results", [])
        if run.get("incomplete"):
            left_out.append(f"{name}: incomplete ({'; '.join(run['incomplete'])})")
            continue
        ours = [r for r in results if r["contender"].startswith("ours-")]
        trl = [r for r in results if r["contender"].startswith("trl-")]
        if len(ours) != 1 or len(trl) != 1 or any("median_s_per_step" not in r for r in ours + trl):
            left_out.append(f"{name}: not one measured pair ({[r['contender'] for r in results]})")
            continue
        host = run.get("host", {})
        floor = run.get("floor", {}).get("floor_s_per_step")
        o, t = ours[0], trl[0]
        rows.append(
            {
                "run": name,
                "pair_index": run.get("pair_index"),
                "order": ",".join(run.get("contenders_in_run_order") or [r["contender"] for r in results]),
                "machine": host.get("hostname", "?"),
                "cpu": host.get("cpu_model", "?"),
                "gpu": host.get("gpu", "?"),
                "commit": str(host.get("commit", "?"))[:12],
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


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f}, {len(values)} pairs)"


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
    summary: dict = {"configurations": {}, "commits": sorted({r["commit"] for r in rows}), "left_out": left_out}
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
    if candidates:
        best = min(candidates, key=lambda f: candidates[f]["trl_median_s"])
        summary["trl_best"] = best
        lines.append(
            f"\nTRL's best measured configuration: trl-sleep@{best} (median {candidates[best]['trl_median_s']:.3f} "
            f"s/step; of {', '.join(sorted(candidates))}). "
            "`@none` (no DeepSpeed) is a reference, never the denominator."
        )
    floors = [r["ours_over_floor"] for r in rows if r["ours_over_floor"] is not None]
    if floors:
        lines.append(f"ours ÷ floor: {spread(floors)}")
    if len(summary["commits"]) > 1:
        lines.append(f"WARNING: the pairs ran on {len(summary['commits'])} commits: {', '.join(summary['commits'])}")
    lines += [f"LEFT OUT: {line}" for line in left_out]
    return lines, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path, help="bench.json of pair runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and statistics here")
    args = parser.parse_args(argv)
    runs = [(path.name, json.loads(path.read_text())) for path in args.runs]
    rows, left_out = pair_rows(runs)
    lines, summary = table(rows, left_out)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"pairs": rows, **summary}, indent=2))
    return 0 if rows and not left_out else 1


if __name__ == "__main__":
    sys.exit(main())
