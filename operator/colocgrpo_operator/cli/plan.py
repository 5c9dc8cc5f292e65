"""`colocgrpo plan -f job.yaml`: will this job fit in GPU memory, and what gpuMemoryUtilization to use.

Exit codes: 0 the job fits, 1 it cannot fit (the output names the term and how many GiB over),
2 bad input (unreadable file, invalid spec, unknown model without spec.model.parameterCount).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from colocgrpo_operator.cli.output import add_output_flag, format_object
from colocgrpo_operator.cli.runtime_flag import add_runtime_flag, load_runtimes

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="estimate per-GPU memory for a ColocGRPOJob and recommend gpuMemoryUtilization",
        description=(
            "Estimate per-GPU memory of the training phase (DeepSpeed model states, activations, LM head) "
            "and the generation phase (vLLM's reservation next to the trainer's states), offline. "
            "Exit 0 when the job fits, 1 when it cannot, 2 on bad input."
        ),
    )
    parser.add_argument("-f", "--filename", required=True, help="ColocGRPOJob YAML file ('-' for stdin)")
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory per GPU in GiB (default: the job's spec.resources.gpuMemoryGiB, else its "
        "colocgrpo.io/gpu-memory-gib annotation, else 139.8 = H200)",
    )
    add_output_flag(parser, "the plan")
    add_runtime_flag(parser)
    parser.set_defaults(func=run)


def _load_job(filename: str) -> tuple[dict[str, Any], Path | None, list[Any]]:
    """The one job document in FILENAME, read as `validate` reads it (same messages for missing files, bad YAML),
    its folder, and every document of the file (a runtime the job names may be among them).

    A file holding a single document is returned whatever its kind, so that the API model names
    what is wrong with it (kind, apiVersion, not a mapping) instead of "no job found".
    """
    from colocgrpo_operator.manifest_files import load_documents

    documents = load_documents(filename)
    base_dir = None if filename == "-" else Path(filename).resolve().parent
    if len(documents) == 1:
        return documents[0], base_dir, documents
    jobs = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "ColocGRPOJob"]
    if not jobs:
        raise ValueError(f"{filename}: no ColocGRPOJob document among its {len(documents)} documents")
    if len(jobs) > 1:
        raise ValueError(f"{filename}: {len(jobs)} ColocGRPOJob documents; plan one at a time")
    return jobs[0], base_dir, documents


def _validation_problems(job: dict[str, Any]) -> list[str]:
    """Field-named problems from the API model, when it is importable (it is in every install)."""
    try:
        from colocgrpo_operator.api import JobSpecError, parse_job
    except ImportError:  # planner usable on its own
        return []
    try:
        parse_job(job)
    except JobSpecError as error:
        return error.lines()
    except Exception as error:
        print(f"warning: spec validation failed internally ({error!r}); planning from the raw spec", file=sys.stderr)
    return []


def _print_rich(plan: Any) -> None:
    from rich.console import Console

    console = Console(soft_wrap=True)
    style = "bold green" if plan.fits else "bold red"
    for index, line in enumerate(plan.lines()):
        if index == 0:
            console.print(line, style=style, markup=False, highlight=False)
        elif line.startswith("problem:"):
            console.print(line, style="red", markup=False, highlight=False)
        elif line.startswith("warning:"):
            console.print(line, style="yellow", markup=False, highlight=False)
        else:
            console.print(line, markup=False, highlight=False)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.api import JobSpecError
    from colocgrpo_operator.api.runtime import runtimes_by_key, with_runtime
    from colocgrpo_operator.render.plan_request import plan_job
    from colocgrpo_training.planner import PlanInputError

    runtimes, unreadable = load_runtimes(args)
    try:
        if unreadable:
            raise ValueError("; ".join(line.removeprefix("error: ") for line in unreadable))
        job, base_dir, documents = _load_job(args.filename)
        # The job as it runs: merged with the runtime it names (the plan is of the merged spec).
        job = with_runtime(job, {**runtimes, **runtimes_by_key(documents)})
    except JobSpecError as error:  # the runtime: missing, invalid, or a locked field overridden
        for line in error.lines():
            print(f"error: {args.filename}: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as error:  # ManifestError too: the message names the file
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    problems = _validation_problems(job)
    if problems:
        for line in problems:
            print(f"error: {args.filename}: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        print("error: --gpu-memory-gib: must be positive", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        plan = plan_job(job, gpu_memory_gib=args.gpu_memory_gib, base_dir=base_dir)
    except PlanInputError as error:
        print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output:
        sys.stdout.write(format_object(plan.to_dict(), args.output))
    else:
        try:
            _print_rich(plan)
        except ImportError:
            print("\n".join(plan.lines()))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT
