"""`colocgrpo watch NAME`: a live view of one job until it finishes.

Exit status: 0 Succeeded, 1 Failed, deleted, not found or the cluster unusable (as kubectl), 2 a usage
error, 3 --timeout passed. With --once: the job as it stands now, exit 0 (1 when not found).
`-o json|yaml` prints the ColocGRPOJob object instead of the view: once with --once, else once
per change (JSON one object after another, YAML one document each).
Uses a watch stream on the one object (field-selected by name), not polling: the Python client's
`ColocGRPOClient.watch`.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors
from colocgrpo_operator.cli.output import add_output_flag, format_object

TERMINAL = {"Succeeded": 0, "Failed": 1}
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Any, width: int = 40) -> str:
    """The last `width` numbers as a row of block characters scaled between their min and max
    (a flat series sits in the middle); anything that is not a finite number is skipped."""
    items = values if isinstance(values, list) else []
    numbers = [float(v) for v in items if isinstance(v, int | float) and not isinstance(v, bool)]
    numbers = [v for v in numbers if math.isfinite(v)][-width:]
    if not numbers:
        return ""
    low, high = min(numbers), max(numbers)
    if high == low:
        return SPARK_BLOCKS[len(SPARK_BLOCKS) // 2 - 1] * len(numbers)
    top = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[round((v - low) / (high - low) * top)] for v in numbers)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        return ""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def _step_text(progress: dict[str, Any]) -> str:
    """`step 12/100 (12%, about 4m33s left)`."""
    text = f"step {progress.get('step')}/{progress.get('maxSteps')}"
    extra = []
    if isinstance(progress.get("percent"), int):
        extra.append(f"{progress['percent']}%")
    left = _duration(progress.get("estimatedRemainingSeconds"))
    if left:
        extra.append(f"about {left} left")
    return f"{text} ({', '.join(extra)})" if extra else text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="follow a ColocGRPOJob live until it succeeds or fails",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="the ColocGRPOJob's metadata.name")
    add_cluster_flags(parser)
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    parser.add_argument("--plain", action="store_true", help="one line per change instead of a live panel")
    parser.add_argument("--once", action="store_true", help="show the job as it stands now and exit 0")
    add_output_flag(parser, "the ColocGRPOJob object (once per change without --once)")
    parser.set_defaults(func=run)


def render_view(obj: dict[str, Any]) -> Any:
    """A rich renderable for one ColocGRPOJob (pure: used by tests and the live view)."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    phase = status.get("phase") or "Pending"
    colour = {"Succeeded": "green", "Failed": "red", "Running": "cyan", "Restarting": "yellow"}.get(phase, "white")
    head = Text.assemble((f"{meta.get('namespace')}/{meta.get('name')}  ", "bold"), (phase, f"bold {colour}"))
    if status.get("message"):
        head.append(f"  {status['message']}", style="dim")
    parts: list[Any] = [head]

    progress = status.get("progress") or {}
    step, max_steps = progress.get("step"), progress.get("maxSteps")
    metrics = progress.get("metrics") or {}
    line = Table.grid(padding=(0, 2))
    line.add_column()
    line.add_column()
    if isinstance(step, int) and isinstance(max_steps, int) and max_steps > 0:
        line.add_row(ProgressBar(total=max_steps, completed=min(step, max_steps), width=40), _step_text(progress))
    else:
        line.add_row(Text("step -", style="dim"), "")
    parts.append(line)
    shown = {k: metrics[k] for k in ("reward", "kl", "loss", "completion_length", "step_time_seconds") if k in metrics}
    if shown:
        numbers = Text(
            "  ".join(f"{k} {v:.4g}" if isinstance(v, int | float) else f"{k} {v}" for k, v in shown.items())
        )
        trend = sparkline(progress.get("rewardHistory"))
        if trend:
            # The reward's trend beside the numbers: the last logged rewards, oldest first.
            numbers.append("  reward trend ", style="dim")
            numbers.append(trend, style="cyan")
        parts.append(numbers)
    workers = status.get("workers") or {}
    facts = [f"restarts {status.get('restarts', 0)}"]
    if workers:
        facts.append(f"workers active {workers.get('active', 0)} ready {workers.get('ready', 0)}")
    if status.get("rank0Pod"):
        facts.append(f"rank 0 {status['rank0Pod']}")
    parts.append(Text("  ".join(facts), style="dim"))

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("condition", "status", "reason", "message"):
        table.add_column(column, overflow="fold")
    for condition in status.get("conditions") or []:
        if not isinstance(condition, dict):
            continue
        flag = condition.get("status")
        style = "green" if flag == "True" else "dim"
        if flag == "True" and condition.get("type") in ("Failed", "Stalled", "PlanWarning"):
            style = "red"
        table.add_row(
            str(condition.get("type")),
            Text(str(flag), style=style),
            str(condition.get("reason") or ""),
            str(condition.get("message") or "")[:200],
        )
    parts.append(table)
    return Group(*parts)


def _plain_line(obj: dict[str, Any]) -> str:
    status = obj.get("status") or {}
    progress = status.get("progress") or {}
    reward = (progress.get("metrics") or {}).get("reward")
    trend = sparkline(progress.get("rewardHistory"))
    return (
        f"{status.get('phase') or 'Pending'}  {_step_text({'step': '-', 'maxSteps': '-', **progress})}"
        f"  reward {reward if reward is not None else '-'}{' ' + trend if trend else ''}  {status.get('message') or ''}"
    )


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from colocgrpo_operator.client import JobDeleted

    client = connect(args)
    console = Console(stderr=False)
    try:
        if args.once:
            obj = dict(client.get(args.name).object)
            if args.output:
                sys.stdout.write(format_object(obj, args.output))
            elif args.plain:
                print(_plain_line(obj))
            else:
                console.print(render_view(obj))
            return 0

        plain = args.plain or args.output is not None or not console.is_terminal
        live: Live | None = None
        last_line = None
        state = None

        def show(current: dict[str, Any]) -> None:
            nonlocal last_line, live
            if args.output:
                # YAML: one document per change, each opened by `---`; JSON: one object after another.
                sys.stdout.write(("---\n" if args.output == "yaml" else "") + format_object(current, args.output))
                sys.stdout.flush()
            elif not plain:
                if live is None:
                    live = Live(render_view(current), console=console, refresh_per_second=4)
                    live.start()
                live.update(render_view(current))
            else:
                line = _plain_line(current)
                if line != last_line:
                    print(line, flush=True)
                    last_line = line

        try:
            for state in client.watch(args.name, timeout=args.timeout):
                show(dict(state.object))
                if state.finished:
                    break
        except JobDeleted as deleted:
            print(f"\n{deleted}", file=sys.stderr)
            return 1
        finally:
            if live is not None:
                live.stop()
    finally:
        client.close()
    assert state is not None  # watch() yields the job first, or raises
    if not state.finished:
        print(f"timed out after {args.timeout:g}s; phase {state.phase}", file=sys.stderr)
        return 3
    if live is None and not args.plain and not args.output:
        console.print(render_view(dict(state.object)))
    return TERMINAL[state.phase or ""]
