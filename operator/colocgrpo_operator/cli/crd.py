"""`colocgrpo crd`: print the ColocGRPOJob CustomResourceDefinition (generated from the API model); with
`--runtimes`, the two runtime CRDs."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "crd",
        help="print the ColocGRPOJob CRD as YAML",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--reference", action="store_true", help="print the Markdown field reference (docs/api.md) instead"
    )
    parser.add_argument(
        "--runtimes",
        action="store_true",
        help="print the ColocGRPORuntime and ClusterColocGRPORuntime CRDs instead",
    )
    parser.add_argument(
        "--helm-template",
        action="store_true",
        help="print it as the template of the colocgrpo-crds chart (kept on helm uninstall)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.reference:
        from colocgrpo_operator.api.reference import field_reference_markdown

        sys.stdout.write(field_reference_markdown())
        return 0
    if args.runtimes:
        from colocgrpo_operator.api.runtime import runtime_crds_yaml

        sys.stdout.write(runtime_crds_yaml(helm_template=args.helm_template))
        return 0
    from colocgrpo_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml(helm_template=args.helm_template))
    return 0
