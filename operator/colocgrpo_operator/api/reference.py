"""The field reference of docs/api.md, generated from the CRD schema (itself generated from the model).

`colocgrpo crd --reference` prints it; tests/api/test_reference.py fails when docs/api.md
holds a stale copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from colocgrpo_operator.api.crd import generate_crd
from colocgrpo_operator.api.model import QUANTITY_PATTERN

BEGIN = "<!-- BEGIN GENERATED FIELD REFERENCE (colocgrpo crd --reference) -->"
END = "<!-- END GENERATED FIELD REFERENCE -->"


def _type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity" if node.get("pattern") == QUANTITY_PATTERN else "integer or string"
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type_of(node['additionalProperties'])}"
    if not kind and node.get("x-kubernetes-preserve-unknown-fields"):
        return "any"
    return kind or "any"


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append(" \\| ".join(f"`{v}`" for v in node["enum"]))
    if "minimum" in node:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {node['minimum']}")
    if "maximum" in node:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {node['maximum']}")
    if node.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(f"`{key}`" for key in node.get("x-kubernetes-list-map-keys", []))
        parts.append(f"one item per {keys}")
    if "minItems" in node:
        parts.append(f"at least {node['minItems']} item(s)")
    if "default" in node and node["default"] != {}:
        value = node["default"]
        parts.append(f"default `{str(value).lower() if isinstance(value, bool) else value}`")
    return "; ".join(parts)


def _rows(node: dict[str, Any], path: str, required: bool) -> Iterator[tuple[str, str, str, str]]:
    description = (node.get("description") or "").replace("|", "\\|").replace("\n", " ")
    constraints = _constraints(node)
    if required:
        constraints = "**required**" + (f"; {constraints}" if constraints else "")
    yield path, _type_of(node), constraints, description
    children = node.get("properties") or {}
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        children = node["items"].get("properties") or {}
        path = f"{path}[]"
        required_children = set(node["items"].get("required", []))
    else:
        required_children = set(node.get("required", []))
    if node.get("x-kubernetes-preserve-unknown-fields") and path != "spec.trainerArgs":
        return  # a Kubernetes core type, passed through
    for name, child in children.items():
        yield from _rows(child, f"{path}.{name}", name in required_children)


def field_reference_markdown() -> str:
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out = [BEGIN, ""]
    for section in ("spec", "status"):
        out += [f"### `{section}`", "", "| Field | Type | Constraints | Description |", "|---|---|---|---|"]
        node = schema["properties"][section]
        for name, child in node["properties"].items():
            for path, kind, constraints, description in _rows(
                child, f"{section}.{name}", name in node.get("required", [])
            ):
                out.append(f"| `{path}` | {kind} | {constraints} | {description} |")
        out.append("")
    out.append(END)
    return "\n".join(out) + "\n"
