"""`colocgrpo from-recipe RECIPE.yaml`: convert a TRL/open-r1 GRPO recipe into a ColocGRPOJob.

The job goes to stdout (or --output-file FILE) with the translation notes as YAML comments
(`-o json`: the job as JSON, without them); the notes also go to stderr. Exit 0 when every key
found a home; exit 1 when something could not be translated (it is listed, never silently
dropped) or the job is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "from-recipe",
        help="convert a TRL/open-r1 GRPO recipe YAML into a ColocGRPOJob",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", help="recipe YAML (e.g. open-r1 recipes/.../config.yaml)")
    parser.add_argument("--name", help="metadata.name (default: from the model name)")
    parser.add_argument("--namespace", help="metadata.namespace")
    parser.add_argument("--nodes", type=int, default=1, help="pods, one per node (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per pod; 0 makes a CPU job (default 8)")
    parser.add_argument(
        "--tp", type=int, help="vLLM tensor-parallel size (default: the recipe's vllm_tensor_parallel_size, else 1)"
    )
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="yaml (default, notes as comments) or json"
    )
    parser.add_argument("--output-file", metavar="FILE", help="write the job here instead of stdout")
    parser.set_defaults(func=run)


def render_job_yaml(job: dict[str, Any], notes: list[str], untranslatable: list[str]) -> str:
    from colocgrpo_operator.manifest_files import dump_documents

    # No file name or date in the header: converting the same recipe gives the same bytes.
    lines = ["# Converted by `colocgrpo from-recipe` from a TRL/open-r1 GRPO recipe."]
    if notes:
        lines.append("# Translation notes:")
        lines += [f"#   - {note}" for note in notes]
    if untranslatable:
        lines.append("# NOT TRANSLATED (meaning lost; fix before use):")
        lines += [f"#   - {item}" for item in untranslatable]
    # Notes can hold multi-line values (a system prompt); keep every line a comment.
    header = "\n".join(line.replace("\n", "\\n") for line in lines) + "\n"
    return header + dump_documents([job])


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from colocgrpo_operator.api.validation import JobSpecError, parse_job
    from colocgrpo_operator.manifest_files import describe_yaml_error
    from colocgrpo_operator.recipe import load_recipe, translate_recipe

    try:
        text = Path(args.recipe).read_text()
    except OSError as error:
        print(f"error: {args.recipe}: cannot read: {error.strerror or error}", file=sys.stderr)
        return 1
    try:
        recipe, duplicates = load_recipe(text)
    except yaml.YAMLError as error:
        print(f"error: {args.recipe}: {describe_yaml_error(error)}", file=sys.stderr)
        return 1
    except ValueError as error:  # not a mapping, or already a Kubernetes manifest
        print(f"error: {args.recipe}: not a recipe: {error}", file=sys.stderr)
        return 1
    job, report = translate_recipe(
        recipe,
        name=args.name,
        namespace=args.namespace,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tp=args.tp,
        duplicates=duplicates,
    )
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    for item in report.untranslatable:
        print(f"not translated: {item}", file=sys.stderr)
    status = 1 if report.untranslatable else 0
    try:
        parse_job(job)
    except JobSpecError as error:
        for line in error.lines():
            print(f"invalid job: {line}", file=sys.stderr)
        status = 1
    if args.output == "json":
        from colocgrpo_operator.cli.output import format_object

        output = format_object(job, "json")
    else:
        output = render_job_yaml(job, report.notes, report.untranslatable)
    if args.output_file:
        Path(args.output_file).write_text(output)
    else:
        sys.stdout.write(output)
    return status
