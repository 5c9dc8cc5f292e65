"""The headline table from several pair runs (python -m bench.grpo --pair ..., one bench.json each).

    python3 -m bench.pair_table RUN.json [RUN.json ...] [--machine RUN.json=LABEL ...] [--probe PROBE.json ...]
        [--json OUT]
    python3 -m bench.pair_table --write [RUN.json ...]    # rewrite the results in README and the benchmark pages
    python3 -m bench.pair_table --check                   # exit 1 where a page's results differ from the raw files

Every run is reported (no best-of): each TRL contender of a run forms one pair with that run's ours
contender, and every pair is a row with its pair index and run order, machine, host CPU, GPU,
commit, ours' and TRL's median s/step, their ratio and ours ÷ the floor printed in the same run.
Then per TRL configuration (the contender with its DeepSpeed file named: trl-sleep under plain ZeRO-3,
under the one-GPU file, without DeepSpeed, trl-best ...): the median ratio over its pairs with the min–max,
overall and per machine. TRL's best in a run is the fastest TRL contender measured in that run that trains
with fp32 master weights (under DeepSpeed); `@none` (bf16 weights and optimizer state) is a reference, never
the best. Last, the verdict on each target of the runs' size (`TARGETS`), overall and on every machine; runs of
different sizes are tabulated apart. A run that is incomplete (a
contender skipped, failed or timed out) is listed, and the pairs it did measure still count; the
table then exits 1. Above the table a paragraph says the same figures in words, and below it a
table of the machines: what each run recorded and measured about its machine, and the figures of
`bench.machine_probe` where `--probe` gives one.

The pages that show these results (`PAGES`) carry them between marker comments that name the runs
they were written from; `--write` renders them again, `--check` compares, and a test runs the check.

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
import difflib
import functools
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# TRL's DeepSpeed files with fp32 master weights: the contenders that may be TRL's best; `@none` is a reference.
DENOMINATOR_FILES = ("plain", "product")
# The file a TRL contender trains under when its name gives none (bench/grpo/contenders.py).
DEFAULT_FILES = {"trl-best": "product"}
# What a GRPO step of ours runs: the trainer (a tree) and the module that renders its DeepSpeed and
# accelerate files (a blob).
MEASURED_CODE = ("training", "operator/colocgrpo_operator/render/launch_config.py")
MEASURED_CODE_BEFORE_2E9977D = ("training", "operator/colocgrpo_operator/render")
# The targets per size: (what, against, statistic, limit). `best` is TRL's best in each run (its fastest contender
# with fp32 master weights); `floor` is ours ÷ the floor printed in the same run. Runs recorded before the bench wrote
# their size are the large size's.
TARGETS = {
    "large": (
        ("ours ÷ TRL's best, median", "best", "median", 0.90),
        ("ours ÷ floor, median", "floor", "median", 2.8),
    ),
    "seed": (
        ("ours ÷ TRL's best, median", "best", "median", 0.80),
        ("ours ÷ floor, median", "floor", "median", 1.5),
    ),
}
MIN_PAIRS = 2


def trl_file(contender: str) -> str:
    """The DeepSpeed file a TRL contender trained under: the name's, else its default."""
    trainer, _, file = contender.partition("@")
    return file or DEFAULT_FILES.get(trainer, "plain")


def trl_configuration(contender: str) -> str:
    """A TRL contender with its DeepSpeed file named: `trl-sleep` is `trl-sleep@plain`, `trl-best` is
    `trl-best@product`."""
    return f"{contender.partition('@')[0]}@{trl_file(contender)}"


def run_size(run: dict) -> str:
    """The size a run measured; runs recorded before the bench wrote it are the large size's."""
    return str(run.get("size", "large"))


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
        order = ",".join(run.get("contenders_in_run_order") or [r["contender"] for r in results])
        floor = run.get("floor", {}).get("floor_s_per_step")
        commit = str(host.get("commit", "?"))
        o = ours[0]
        # TRL's best in this run: its fastest contender with fp32 master weights.
        fp32 = [t for t in trl if trl_file(t["contender"]) in DENOMINATOR_FILES]
        best = min(fp32, key=lambda t: t["median_s_per_step"]) if fp32 else None
        for t in trl:
            rows.append(
                {
                    "run": name,
                    "pair_index": run.get("pair_index"),
                    "order": order,
                    "machine": machine_of(name, run, machines),
                    "cpu": host.get("cpu_model", "?"),
                    "gpu": host.get("gpu", "?"),
                    "commit": commit[:12],
                    # Runs without the field predate it, and 2e9977d: the folder's tree then.
                    "code": host.get("measured_code")
                    or (measured_code(commit, paths=MEASURED_CODE_BEFORE_2E9977D) if commit != "?" else "?"),
                    "ours": o["contender"],
                    "ours_s": o["median_s_per_step"],
                    "size": run_size(run),
                    "trl": t["contender"],
                    "trl_file": trl_file(t["contender"]),
                    "trl_configuration": trl_configuration(t["contender"]),
                    "trl_best": t is best,
                    "trl_s": t["median_s_per_step"],
                    "ratio": o["median_s_per_step"] / t["median_s_per_step"],
                    "ours_over_floor": o["median_s_per_step"] / floor if floor else None,
                }
            )
    sizes = sorted({r["size"] for r in rows})
    if len(sizes) > 1:
        raise SystemExit(f"the runs measured different sizes ({', '.join(sizes)}): tabulate each size apart")
    return rows, left_out


def spread(values: list[float], unit: str = "pairs") -> str:
    count = f"{len(values)} {unit if len(values) != 1 else unit.removesuffix('s')}"
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f}, {count})"


def verdicts(rows: list[dict]) -> tuple[list[str], list[dict]]:
    """Each target of the rows' size (`TARGETS`) over all pairs (met only with `MIN_PAIRS` pairs) and on every
    machine."""
    lines, found = ["", "| target | scope | value | limit | pairs | verdict |", "|---|---|---|---|---|---|"], []
    machines = sorted({r["machine"] for r in rows})
    sizes = {r["size"] for r in rows}
    for what, against, statistic, limit in TARGETS.get(sizes.pop(), ()) if len(sizes) == 1 else ():
        for scope in ["all", *machines]:
            mine = [r for r in rows if scope in ("all", r["machine"])]
            if against == "floor":
                per_run = {r["run"]: r["ours_over_floor"] for r in mine if r["ours_over_floor"] is not None}
                values = list(per_run.values())
            elif against == "best":
                values = [r["ratio"] for r in mine if r["trl_best"]]
            else:
                values = [r["ratio"] for r in mine if r["trl_configuration"] == "trl-sleep@plain"]
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


def table(rows: list[dict], left_out: list[str], run_cell: Callable[[str], str] = str) -> tuple[list[str], dict]:
    """The pair rows, the statistics per TRL configuration, TRL's best, the floor and the verdicts, as Markdown
    lines; `run_cell` writes a run's name into its cell (a link on a page). Returns the lines and the summary."""
    lines = [
        "| run | pair index | run order | machine | host CPU | GPU | commit | ours s/step | TRL | TRL s/step "
        "| ratio | ours ÷ floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = "" if r["ours_over_floor"] is None else f"{r['ours_over_floor']:.2f}"
        lines.append(
            f"| {run_cell(r['run'])} | {r['pair_index']} | {r['order']} | {r['machine']} | {r['cpu']} | {r['gpu']} "
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
    for configuration in sorted({r["trl_configuration"] for r in rows}):
        mine = [r for r in rows if r["trl_configuration"] == configuration]
        summary["configurations"][configuration] = statistics_of(mine)
        lines.append(
            f"| {configuration} | {summary['configurations'][configuration]['trl_median_s']:.3f} | {ratios(mine)}"
        )
    best_rows = [r for r in rows if r["trl_best"]]
    if best_rows:
        summary["trl_best"] = statistics_of(best_rows)
        summary["trl_best"]["chosen"] = {
            c: sum(r["trl_configuration"] == c for r in best_rows)
            for c in sorted({r["trl_configuration"] for r in best_rows})
        }
        chosen = ", ".join(f"{c} in {n} run{'s' if n != 1 else ''}" for c, n in summary["trl_best"]["chosen"].items())
        lines += [
            f"| TRL's best in each run ({chosen}) | {summary['trl_best']['trl_median_s']:.3f} | {ratios(best_rows)}",
            "",
            "TRL's best in a run is its fastest contender there with fp32 master weights (under DeepSpeed); "
            "`@none` (no DeepSpeed: bf16 weights and optimizer state) is a reference, never the best.",
        ]
    per_run_floor = {r["run"]: r["ours_over_floor"] for r in rows if r["ours_over_floor"] is not None}
    if per_run_floor:
        lines += ["", f"ours ÷ floor: {spread(list(per_run_floor.values()), 'runs')}"]
    target_lines, summary["targets"] = verdicts(rows)
    lines += [*target_lines, ""]
    if len(summary["measured_code"]) > 1:
        lines.append(
            f"- WARNING: the pairs measured {len(summary['measured_code'])} versions of the trainer's code "
            f"(git objects of {' and '.join(MEASURED_CODE)}, or before 2e9977d of "
            f"{' and '.join(MEASURED_CODE_BEFORE_2E9977D)}): {', '.join(summary['measured_code'])}"
        )
    elif len(summary["commits"]) > 1:
        lines.append(
            f"- The pairs ran on {len(summary['commits'])} commits ({', '.join(summary['commits'])}) with the same "
            f"trainer code (git objects {summary['measured_code'][0]})."
        )
    lines += [f"- LEFT OUT: {line}" for line in left_out]
    return lines, summary


def statistics_of(rows: list[dict]) -> dict:
    """Pairs, TRL's median s/step, and ours ÷ TRL: median, min, max, and the median per machine."""
    machines = sorted({r["machine"] for r in rows})
    return {
        "pairs": len(rows),
        "trl_median_s": statistics.median(r["trl_s"] for r in rows),
        "ratio_median": statistics.median(r["ratio"] for r in rows),
        "ratio_min": min(r["ratio"] for r in rows),
        "ratio_max": max(r["ratio"] for r in rows),
        "machines": {m: statistics.median(r["ratio"] for r in rows if r["machine"] == m) for m in machines},
    }


def ratios(rows: list[dict]) -> str:
    """The ratio cells of a configuration's row: over all its pairs, and per machine."""
    machines = sorted({r["machine"] for r in rows})
    per_machine = {m: [r["ratio"] for r in rows if r["machine"] == m] for m in machines}
    return f"{spread([r['ratio'] for r in rows])} | {'; '.join(f'{m}: {spread(v)}' for m, v in per_machine.items())} |"


def machine_of(name: str, run: dict, machines: dict[str, str] | None = None) -> str:
    """The machine a run ran on, as the rows name it: `--machine`'s label, else the first 8 characters of the
    boot id (every lent GPU machine has the host name `vm`), else the host name."""
    host = run.get("host", {})
    label = (machines or {}).get(name)
    return label or (str(host["boot_id"])[:8] if host.get("boot_id") else str(host.get("hostname", "?")))


def rate_range(values: list[float], digits: int = 0) -> str:
    """`a` or `a–b` for measurements of one quantity, '—' for none."""
    if not values:
        return "—"
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def machine_table(
    runs: list[tuple[str, dict]], probes: list[dict], machines: dict[str, str] | None = None
) -> list[str]:
    """One row per machine of `runs`: what was measured about it. The host CPU and GPU each run recorded, the
    HBM bandwidth and bf16 matmul rate the bench measured for its floor in every run, and, where
    `bench.machine_probe` ran on it (matched by boot id), the probe's host memory, pinned copy, kernel launch
    and matmul rates, one figure per probe in the order given."""
    lines = [
        "| machine | host CPU | GPU | runs | HBM TB/s | bf16 TFLOP/s | probe: host memory GiB/s, first touch / "
        "rewritten | probe: pinned copy to GPU GiB/s | probe: kernel launch µs | probe: bf16 TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_machine: dict[str, list[dict]] = {}
    for name, run in runs:
        by_machine.setdefault(machine_of(name, run, machines), []).append(run)
    for machine, mine in by_machine.items():
        host = mine[0].get("host", {})
        cpu = f"{host.get('cpu_model', '?')}, {host.get('cpu_count', '?')} cores"
        measured = [run.get("machine", {}) for run in mine]
        hbm = [m["hbm_bytes_per_s"] / 1e12 for m in measured if m.get("hbm_bytes_per_s")]
        flops = [m["bf16_flop_per_s"] / 1e12 for m in measured if m.get("bf16_flop_per_s")]
        boot_id = host.get("boot_id")
        found = [p for p in probes if boot_id and p.get("host", {}).get("boot_id") == boot_id]
        memory = ", ".join(
            f"{p['memory']['first_pass_gib_s']['median']:.1f} / {p['memory']['second_pass_gib_s']['median']:.1f}"
            for p in found
        )
        copy = ", ".join(f"{p['before']['h2d_gib_s']:.1f}" for p in found)
        launch = ", ".join(f"{p['before']['launch_us']:.1f}" for p in found)
        matmul = ", ".join(f"{p['before']['matmul_tflops']:.0f}" for p in found)
        lines.append(
            f"| {machine} | {cpu} | {host.get('gpu', '?')} | {len(mine)} | {rate_range(hbm, 2)} "
            f"| {rate_range(flops)} | {memory or '—'} | {copy or '—'} | {launch or '—'} | {matmul or '—'} |"
        )
    return lines


# How the headline names each TRL configuration: its DeepSpeed file, and what the contender changes in TRL.
CONFIGURATION_WORDS = {
    "plain": "under TRL's documented ZeRO-3 file",
    "product": "under the operator's one-GPU DeepSpeed file",
    "none": "without DeepSpeed (bf16 weights and optimizer state, a reference rather than a target)",
}
TRAINER_WORDS = {"trl-best": "with our merged micro-batch ", "trl-nosleep": "with sleep off "}


def configuration_words(configuration: str) -> str:
    trainer, _, file = configuration.partition("@")
    return TRAINER_WORDS.get(trainer, "") + CONFIGURATION_WORDS.get(file, f"as `{configuration}`")


def headline(runs: list[tuple[str, dict]], rows: list[dict], summary: dict) -> str:
    """The results in one paragraph, the figures of `table`'s statistics: per TRL configuration ours' median
    ratio with its pairs, machines and range, TRL's best among them, and ours against the floor."""
    if not rows:
        return "No pair was measured."
    run = dict(runs)[rows[0]["run"]]
    params = next((r["params"] for r in run.get("results", []) if r.get("params")), 0)
    size = f"{params / 1e9:.2f}B parameters" if params else f"the {run.get('size', '?')} size"
    gpu = str(rows[0]["gpu"]).split(",")[0]
    configurations = summary["configurations"]

    def file_of(configuration: str) -> str:
        return configuration.partition("@")[2]

    order = sorted(configurations, key=lambda c: (file_of(c) == "none", file_of(c) not in DENOMINATOR_FILES, c))
    parts = [
        f"**{configurations[c]['ratio_median']:.3f}×** as long as TRL's {configuration_words(c)} "
        f"({counted(configurations[c])})"
        for c in order
    ]
    listed = " and ".join(parts) if len(parts) < 3 else "; ".join(parts[:-1]) + "; and " + parts[-1]
    text = f"At {size} on one {gpu}, a GRPO step of {rows[0]['ours']} took {listed}."
    if best := summary.get("trl_best"):
        text += (
            f" Against TRL's best in each run, its fastest configuration there with fp32 master weights: "
            f"**{best['ratio_median']:.3f}×** ({counted(best)})."
        )
    text += (
        " TRL ran its own `GRPOTrainer` in colocate mode with vLLM's sleep mode on, in the same run as ours, each "
        "run on one machine."
    )
    floors = {r["run"]: r["ours_over_floor"] for r in rows if r["ours_over_floor"] is not None}
    if floors:
        values = list(floors.values())
        spread_of = f" (median {statistics.median(values):.2f}, {len(values)} runs)" if len(values) > 1 else ""
        text += f" Ours took {rate_range(values, 2)}× the hardware floor measured in the same run{spread_of}."
    return text


def counted(statistics: dict) -> str:
    """'median of N pairs on M machines, range a–b', or '1 pair'."""
    machines = len(statistics["machines"])
    if statistics["pairs"] == 1:
        return "1 pair"
    return (
        f"median of {statistics['pairs']} pairs on {machines} machine{'s' if machines != 1 else ''}, "
        f"range {statistics['ratio_min']:.3f}–{statistics['ratio_max']:.3f}"
    )


# The pages whose results this tool writes, between marker comments: an opening
# `<!-- bench.pair_table NAME KIND: ARGS -->` and a closing `<!-- /bench.pair_table NAME -->`. KIND is `table`
# (everything `main` prints, with the headline above it and a table of the machines) or `headline` (its
# paragraph only); ARGS are this command's arguments, relative to the repository root, that produced it.
PAGES = ("README.md", "docs/benchmarks/README.md", "docs/benchmarks/gpu.md")
BLOCK = re.compile(
    r"^<!-- bench\.pair_table (?P<name>[\w-]+) (?P<kind>table|headline): (?P<args>[^\n]*?) -->\n"
    r"(?P<body>.*?)"
    r"^<!-- /bench\.pair_table (?P=name) -->$",
    re.S | re.M,
)
# The blocks that `--write RUN.json ...` gives new runs; the other blocks keep theirs.
CURRENT = "current"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="bench.json of pair runs")
    parser.add_argument(
        "--machine",
        action="append",
        default=[],
        metavar="RUN=LABEL",
        help="the machine of a run recorded without a boot id (RUN is the file's name)",
    )
    parser.add_argument(
        "--probe", action="append", default=[], type=Path, help="a machine_probe.json, matched to runs by boot id"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and statistics here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--write",
        action="store_true",
        help=f"rewrite the results on the pages ({', '.join(PAGES)}); given runs, those of the '{CURRENT}' blocks",
    )
    mode.add_argument("--check", action="store_true", help="exit 1 where a page's results differ from the raw files")
    return parser


def load(args: argparse.Namespace) -> tuple[list[tuple[str, dict]], list[dict], dict[str, str]]:
    machines = dict(m.split("=", 1) for m in args.machine)
    runs = [(path.name, json.loads(path.read_text())) for path in args.runs]
    probes = [json.loads(path.read_text()) for path in args.probe]
    return runs, probes, machines


def block_args(stored: str, repo: Path = REPO) -> argparse.Namespace:
    """A marker's ARGS as parsed arguments, paths resolved against `repo` (globs expanded, sorted)."""
    words = []
    for word in shlex.split(stored):
        if word.startswith("-") or "=" in word:
            words.append(word)
        else:
            matches = sorted(glob.glob(str(repo / word)))
            words += matches or [str(repo / word)]
    return parser().parse_args(words)


def render_block(kind: str, stored: str, page: Path, repo: Path = REPO) -> str:
    """The Markdown between a block's markers, from the runs its ARGS name; links relative to `page`."""
    args = block_args(stored, repo)
    runs, probes, machines = load(args)
    rows, left_out = pair_rows(runs, machines)
    paths = {path.name: path for path in args.runs}

    def link(name: str) -> str:
        return f"[{name}]({Path(os.path.relpath(paths[name], page.parent)).as_posix()})"

    lines, summary = table(rows, left_out, run_cell=link)
    text = headline(runs, rows, summary)
    if kind == "table":
        text += "\n\n" + "\n".join([*lines, "", *machine_table(runs, probes, machines)])
    return text.strip() + "\n"


def rewrite(text: str, page: Path, new_args: str | None = None, repo: Path = REPO) -> str:
    """`text` with every block's body rendered again; with `new_args`, the `CURRENT` blocks take those."""

    def block(match: re.Match[str]) -> str:
        name, kind = match["name"], match["kind"]
        stored = new_args if new_args is not None and name == CURRENT else match["args"]
        body = render_block(kind, stored, page, repo)
        return f"<!-- bench.pair_table {name} {kind}: {stored} -->\n{body}<!-- /bench.pair_table {name} -->"

    return BLOCK.sub(block, text)


def stored_args(args: argparse.Namespace, repo: Path = REPO) -> str:
    """The command line's runs, labels and probes as a marker's ARGS, relative to `repo`.

    Raises:
        ValueError: a run or probe lies outside `repo`.
    """

    def relative(path: Path) -> str:
        return path.resolve().relative_to(repo.resolve()).as_posix()

    words = [relative(path) for path in args.runs]
    words += [f"--machine={label}" for label in args.machine]
    words += [f"--probe={relative(path)}" for path in args.probe]
    return shlex.join(words)


def write_pages(new_args: str | None = None, repo: Path = REPO) -> None:
    """Every block on `PAGES` rendered again from the raw files; with `new_args`, the `CURRENT` blocks' runs."""
    for name in PAGES:
        page = repo / name
        page.write_text(rewrite(page.read_text(), page, new_args, repo))


def stale_pages(repo: Path = REPO) -> dict[str, str]:
    """The pages whose written results differ from what the raw files give now: page → unified diff."""
    stale = {}
    for name in PAGES:
        page = repo / name
        text = page.read_text()
        fresh = rewrite(text, page, repo=repo)
        if fresh != text:
            diff = difflib.unified_diff(text.splitlines(), fresh.splitlines(), name, f"{name} (raw files)", lineterm="")
            stale[name] = "\n".join(diff)
    return stale


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.check:
        stale = stale_pages()
        for diff in stale.values():
            print(diff)
        if stale:
            print(f"stale: {', '.join(stale)}; rewrite with python -m bench.pair_table --write", file=sys.stderr)
        return 1 if stale else 0
    if args.write:
        write_pages(stored_args(args) if args.runs else None)
        return 0
    if not args.runs:
        parser().error("give the runs' bench.json, or --write / --check")
    runs, probes, machines = load(args)
    rows, left_out = pair_rows(runs, machines)
    lines, summary = table(rows, left_out)
    print("\n".join([headline(runs, rows, summary), "", *lines, "", *machine_table(runs, probes, machines)]))
    if args.json:
        args.json.write_text(json.dumps({"pairs": rows, **summary}, indent=2))
    return 0 if rows and not left_out else 1


if __name__ == "__main__":
    sys.exit(main())
