"""`colocgrpo render -f FILE`: the Kubernetes objects the operator would create, as multi-document YAML.

Offline and pure: nothing is sent to a cluster. Invalid jobs exit 1 with the same
field-named lines as `colocgrpo validate`.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("render", help="print the children of a ColocGRPOJob as multi-document YAML")
    parser.add_argument("-f", "--filename", required=True, help="YAML file with one or more ColocGRPOJobs ('-' for stdin)")
    parser.add_argument("-n", "--namespace", help="namespace for jobs that do not set metadata.namespace")
    parser.add_argument("--trainer-image", help="default trainer image when spec.image is unset (as the operator's flag)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from colocgrpo_operator.api.validation import JobSpecError, parse_job
    from colocgrpo_operator.manifest_files import ManifestError, dump_documents, load_documents
    from colocgrpo_operator.render import render_children

    try:
        documents = load_documents(args.filename)
    except ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    objects = []
    failed = False
    for index, document in enumerate(documents):
        label = args.filename if len(documents) == 1 else f"{args.filename}[{index}]"
        if args.namespace and isinstance(document, dict) and isinstance(document.get("metadata"), dict):
            document["metadata"].setdefault("namespace", args.namespace)
        try:
            job = parse_job(document)
        except JobSpecError as error:
            failed = True
            for line in error.lines():
                print(f"{label}: {line}", file=sys.stderr)
            continue
        objects.extend(render_children(job, default_image=args.trainer_image))
    if failed:
        return 1
    sys.stdout.write(dump_documents(objects))
    return 0
