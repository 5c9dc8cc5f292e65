"""`colocgrpo render -f FILE`: the Kubernetes objects the operator would create, as multi-document YAML.

Offline and pure: nothing is sent to a cluster. Invalid jobs exit 1 with the same
field-named lines as `colocgrpo validate`. `-o json` prints the objects as one `v1 List`;
either form is what `kubectl apply -f` reads.
"""

from __future__ import annotations

import argparse
import sys

from colocgrpo_operator.cli.runtime_flag import add_runtime_flag, load_runtimes


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "render",
        help="print the children of a ColocGRPOJob as multi-document YAML",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f", "--filename", required=True, help="YAML file with one or more ColocGRPOJobs ('-' for stdin)"
    )
    parser.add_argument("-n", "--namespace", help="namespace for jobs that do not set metadata.namespace")
    parser.add_argument(
        "--trainer-image", help="default trainer image when spec.image is unset (as the operator's flag)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("json", "yaml"),
        default="yaml",
        help="yaml: one document per object (default); json: one v1 List",
    )
    add_runtime_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.cli.output import as_list, format_object
    from colocgrpo_operator.manifest_files import dump_documents, read_jobs
    from colocgrpo_operator.render import render_children

    runtimes, problems = load_runtimes(args)
    jobs, job_problems = read_jobs(args.filename, namespace=args.namespace, runtimes=runtimes)
    problems += job_problems
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 1
    objects = [obj for _label, job in jobs for obj in render_children(job, default_image=args.trainer_image)]
    sys.stdout.write(format_object(as_list(objects), "json") if args.output == "json" else dump_documents(objects))
    return 0
