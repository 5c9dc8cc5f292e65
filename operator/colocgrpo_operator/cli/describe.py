"""`colocgrpo describe NAME`: one ColocGRPOJob in full, as `kubectl describe` shows an object: its phase,
progress and restarts, its conditions, the last gang failure, its pods, the planner's per-GPU memory
verdict for its spec (what `colocgrpo plan` prints for the job's file), and its Events.

Exit status: 0; 1 no such job, or the cluster unusable (as kubectl); 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from colocgrpo_operator.cli.cluster_errors import add_cluster_flags, connect, reports_cluster_errors
from colocgrpo_operator.cli.output import table

if TYPE_CHECKING:
    from colocgrpo_operator.client import JobState


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "describe",
        help="show a ColocGRPOJob in full: conditions, last failure, pods, memory plan, Events",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="the ColocGRPOJob's metadata.name")
    add_cluster_flags(parser)
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory per GPU for the plan (default: the job's colocgrpo.io/gpu-memory-gib annotation, else an H200's)",
    )
    parser.set_defaults(func=run)


def _when(timestamp: Any, now: datetime) -> str:
    from colocgrpo_operator.client.views import age

    ago = age(timestamp, now)
    return f"{timestamp} ({ago} ago)" if ago else "<unknown>"


def _indented(lines: Iterable[str], by: str = "  ") -> list[str]:
    return [f"{by}{line}" if line else "" for line in lines]


def _labels(labels: Any) -> str:
    if not isinstance(labels, Mapping) or not labels:
        return "<none>"
    return ", ".join(f"{key}={value}" for key, value in sorted(labels.items()))


def _progress_line(state: JobState) -> str:
    progress = state.progress()
    if progress.step is None:
        return "<not reported yet>"
    parts = [f"step {progress.step}/{progress.max_steps if progress.max_steps is not None else '-'}"]
    if progress.percent is not None:
        parts[0] += f" ({progress.percent}%)"
    if progress.reward is not None:
        parts.append(f"reward {progress.reward:.4g}")
    if progress.estimated_remaining_seconds is not None:
        from colocgrpo_operator.client.views import human_duration

        parts.append(f"about {human_duration(progress.estimated_remaining_seconds)} left")
    if progress.last_update_time:
        parts.append(f"reported {progress.last_update_time}")
    return ", ".join(parts)


def _event_age(event: Mapping[str, Any], now: datetime) -> str:
    from colocgrpo_operator.client.views import age

    series = event.get("series") or {}
    last = event.get("lastTimestamp") or series.get("lastObservedTime") or event.get("eventTime")
    first = event.get("firstTimestamp") or event.get("eventTime")
    count = event.get("count") or series.get("count") or 1
    text = age(last or first, now) or "<unknown>"
    return f"{text} (x{count} over {age(first, now)})" if isinstance(count, int) and count > 1 and first else text


def describe(
    state: JobState,
    events: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    plan_lines: list[str],
    now: datetime | None = None,
) -> str:
    """The text of `colocgrpo describe` (pure: what the cluster said goes in, text comes out)."""
    from colocgrpo_operator.client.logs import pod_name, rank_of
    from colocgrpo_operator.client.views import age

    now = now or datetime.now(UTC)
    meta = state.object.get("metadata") or {}
    spec = state.object.get("spec") or {}
    resources, vllm = spec.get("resources") or {}, spec.get("vllm") or {}
    run_policy = spec.get("runPolicy") or {}
    workers = state.status.get("workers") or {}
    fields = [
        ("Name", state.name),
        ("Namespace", state.namespace),
        ("Labels", _labels(meta.get("labels"))),
        ("Created", _when(meta.get("creationTimestamp"), now)),
        ("Phase", f"{state.phase or '<none yet>'}" + (f": {state.message}" if state.message else "")),
        ("Suspend", "true" if state.suspended else "false"),
        ("Model", str((spec.get("model") or {}).get("name") or "")),
        (
            "Gang",
            f"{resources.get('nodes')} node(s) x {resources.get('gpusPerNode')} GPU(s), vLLM TP "
            f"{vllm.get('tensorParallelSize')}; workers active {workers.get('active', 0)}, "
            f"ready {workers.get('ready', 0)}, GPUs held {workers.get('gpus', 0)}",
        ),
        ("Progress", _progress_line(state)),
        (
            "Restarts",
            f"{state.restarts} of at most {run_policy.get('maxRestarts')}"
            + (f" (and {state.status['disruptions']} after disruptions)" if state.status.get("disruptions") else ""),
        ),
    ]
    metrics = {k: v for k, v in state.progress().metrics.items() if k != "reward"}
    if metrics:
        fields.append(("Metrics", "  ".join(f"{key} {value:.4g}" for key, value in sorted(metrics.items()))))
    if state.status.get("startTime"):
        fields.append(("Started", _when(state.status.get("startTime"), now)))
    if state.status.get("completionTime"):
        fields.append(("Completed", _when(state.status.get("completionTime"), now)))
    width = max(len(name) for name, _ in fields) + 3
    lines = [f"{name + ':':<{width}}{value}" for name, value in fields]

    lines.append("Conditions:")
    if state.conditions:
        rows = [
            [
                str(c.get("type") or ""),
                str(c.get("status") or ""),
                str(c.get("reason") or ""),
                age(c.get("lastTransitionTime"), now),
                str(c.get("message") or ""),
            ]
            for c in state.conditions
        ]
        lines += _indented(table(rows, ["Type", "Status", "Reason", "Age", "Message"]).splitlines())
    else:
        lines.append("  <none>")

    lines.append("Last failure:")
    failure = state.last_failure
    if failure:
        for key, label in (("reason", "Reason"), ("message", "Message"), ("pod", "Pod"), ("exitCode", "Exit code")):
            if failure.get(key) not in (None, ""):
                lines.append(f"  {label + ':':<12}{failure[key]}")
        if failure.get("counted") is not None:
            counted = "yes" if failure["counted"] else "no (an eviction or preemption)"
            lines.append(f"  {'Counted:':<12}{counted}")
        if failure.get("time"):
            lines.append(f"  {'Time:':<12}{_when(failure['time'], now)}")
    else:
        lines.append("  <none>")

    lines.append("Pods:")
    if pods:
        rows = [
            [
                str(rank_of(pod) if rank_of(pod) is not None else "?"),
                pod_name(pod),
                str((pod.get("status") or {}).get("phase") or "")
                + (" (deleting)" if (pod.get("metadata") or {}).get("deletionTimestamp") else ""),
                str((pod.get("spec") or {}).get("nodeName") or ""),
                age((pod.get("metadata") or {}).get("creationTimestamp"), now),
            ]
            for pod in pods
        ]
        lines += _indented(table(rows, ["Rank", "Pod", "Phase", "Node", "Age"]).splitlines())
    else:
        lines.append("  <none>")

    lines.append("Plan:")
    lines += _indented(plan_lines) if plan_lines else ["  <none>"]

    lines.append("Events:")
    if events:
        rows = [
            [
                str(event.get("type") or ""),
                str(event.get("reason") or ""),
                _event_age(event, now),
                str(
                    (event.get("source") or {}).get("component")
                    or event.get("reportingComponent")
                    or event.get("reportingController")
                    or ""
                ),
                str(event.get("message") or event.get("note") or ""),
            ]
            for event in events
        ]
        lines += _indented(table(rows, ["Type", "Reason", "Age", "From", "Message"]).splitlines())
    else:
        lines.append("  <none>")
    return "\n".join(lines) + "\n"


def plan_text(client: Any, name: str, gpu_memory_gib: float | None) -> list[str]:
    """The planner's lines for the job's spec, or one line saying why it cannot plan it."""
    from colocgrpo_operator.client import ClientError
    from colocgrpo_training.planner import PlanInputError

    try:
        return client.plan(name, gpu_memory_gib=gpu_memory_gib).lines()
    except PlanInputError as error:
        return [f"cannot plan: {error.field}: {error.message}"]
    except ClientError:
        raise
    except Exception as error:  # the planner's own failure must not hide the rest of the description
        return [f"cannot plan: the planner failed: {error!r}"]


@reports_cluster_errors
def run(args: argparse.Namespace) -> int:
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        print("error: --gpu-memory-gib: must be positive", file=sys.stderr)
        return 2
    client = connect(args)
    try:
        state = client.get(args.name)
        text = describe(
            state,
            client.events(args.name),
            client.pods(args.name),
            plan_text(client, args.name, args.gpu_memory_gib),
        )
    finally:
        client.close()
    sys.stdout.write(text)
    return 0
