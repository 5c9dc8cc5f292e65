"""`-o json|yaml`: a command's object printed for programs, as kubectl's `-o` prints it; and the tables
printed for people, set as kubectl sets them.

JSON is indented and ends with a newline; YAML is one document. Several Kubernetes objects are
printed as one `v1 List` (what `kubectl get -o json` prints for several, and what `kubectl apply -f`
reads), unless the command says otherwise.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

OUTPUT_FORMATS = ("json", "yaml")


def add_output_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """Add `-o/--output {json,yaml}`; `what` completes the help text ("print ... as JSON or YAML")."""
    parser.add_argument(
        "-o", "--output", choices=OUTPUT_FORMATS, default=None, help=f"print {what} as JSON or YAML instead"
    )


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Several Kubernetes objects as one `v1 List`."""
    return {"apiVersion": "v1", "kind": "List", "items": items}


def format_object(obj: Any, output: str) -> str:
    """`obj` as `output` (json or yaml) text, ending with a newline."""
    if output == "json":
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    from colocgrpo_operator.manifest_files import dump_documents

    return dump_documents([obj])


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Rows in columns as kubectl's tab writer sets them: each column as wide as its widest cell plus 3
    spaces, at least 6; the last column not padded. Pure."""
    widths = [max(6, max(len(str(cell)) for cell in column) + 3) for column in zip(header, *rows, strict=True)]
    lines = []
    for cells in (header, *rows):
        padded = "".join(str(cell).ljust(width) for cell, width in zip(cells[:-1], widths[:-1], strict=True))
        lines.append((padded + str(cells[-1])).rstrip())
    return "\n".join(lines) + "\n"
