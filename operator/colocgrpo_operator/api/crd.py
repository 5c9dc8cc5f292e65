"""The CustomResourceDefinition, generated from the pydantic model.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0
schema. The conversion below inlines $refs, turns `X | None` into plain X (the API
server prunes nulls of non-nullable fields), rewrites numeric exclusive bounds into the
OpenAPI 3.0 boolean form, drops titles, and keeps free-form Kubernetes types as
`x-kubernetes-preserve-unknown-fields` objects. Rules that span fields are CEL
`x-kubernetes-validations` generated from their one table (colocgrpo_training.rules), which
api/validation.py evaluates too, so the API server and `colocgrpo validate` agree.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import BaseModel

from colocgrpo_operator.api.model import ColocGRPOJobSpec, ColocGRPOJobStatus
from colocgrpo_operator.api.naming import (
    CRD_NAME,
    DNS_1035_LABEL_PATTERN,
    GROUP,
    KIND,
    MAX_JOB_NAME_LENGTH,
    OPERATOR_NAME,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from colocgrpo_operator.api.trainer_args import OWNED_KEYS, REFUSED_KEYS, RENAMED_KEYS, grpo_config_fields
from colocgrpo_operator.api.validation import MUTABLE_AFTER_START
from colocgrpo_training.rules import RULES, Rule

_DROPPED_KEYWORDS = {"title", "$defs", "examples"}


def _resolve(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, list):
        return [_resolve(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].split("/")[-1]])
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        target.update(siblings)  # a field's own description/default wins over the model's
        return _resolve(target, defs)
    return {key: _resolve(value, defs) for key, value in schema.items()}


def _structural(schema: dict[str, Any], *, keep_defaults: bool) -> dict[str, Any]:
    """Rewrite one resolved JSON-Schema node (recursively) into Kubernetes' dialect."""
    schema = dict(schema)
    for key in _DROPPED_KEYWORDS:
        schema.pop(key, None)

    # `X | None` -> X; the description/default of the outer node survives.
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        options = [option for option in schema["anyOf"] if option.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {schema['anyOf']}")
        outer = {k: v for k, v in schema.items() if k != "anyOf"}
        merged = dict(options[0])
        merged.update(outer)
        return _structural(merged, keep_defaults=keep_defaults)

    if "default" in schema and (schema["default"] is None or not keep_defaults):
        del schema["default"]

    # JSON Schema 2020 numeric exclusive bounds -> OpenAPI 3.0 (boolean flag), or for
    # integers simply the next integer, which reads better in `kubectl explain`.
    for bound, inclusive, step in (("exclusiveMinimum", "minimum", 1), ("exclusiveMaximum", "maximum", -1)):
        value = schema.get(bound)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if schema.get("type") == "integer" and isinstance(value, int):
                schema[inclusive] = value + step
                del schema[bound]
            else:
                schema[inclusive] = value
                schema[bound] = True

    if "properties" in schema:
        schema["properties"] = {
            name: _structural(sub, keep_defaults=keep_defaults) for name, sub in schema["properties"].items()
        }
        # Structural schemas close objects by pruning, not by additionalProperties: false.
        if schema.get("additionalProperties") is False:
            del schema["additionalProperties"]
        if schema.get("additionalProperties") is True:
            del schema["additionalProperties"]
            schema["x-kubernetes-preserve-unknown-fields"] = True
        # An absent sub-object defaults to {} so its own field defaults apply (and show in kubectl).
        if keep_defaults:
            required = set(schema.get("required", []))
            for name, sub in schema["properties"].items():
                if (
                    name not in required
                    and sub.get("type") == "object"
                    and "default" not in sub
                    and any("default" in p for p in sub.get("properties", {}).values())
                ):
                    sub["default"] = {}
    elif isinstance(schema.get("additionalProperties"), dict):
        schema["additionalProperties"] = _structural(schema["additionalProperties"], keep_defaults=keep_defaults)
        schema.setdefault("type", "object")
    elif schema.get("additionalProperties") is True:
        del schema["additionalProperties"]
        schema["x-kubernetes-preserve-unknown-fields"] = True
        schema.setdefault("type", "object")
    if isinstance(schema.get("items"), dict):
        schema["items"] = _structural(schema["items"], keep_defaults=keep_defaults)
    if schema.get("type") == "string" and "enum" in schema and "default" in schema:
        schema["default"] = str(schema["default"])
    return schema


def model_schema(model: type[BaseModel], *, keep_defaults: bool) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs), keep_defaults=keep_defaults)


# ----------------------------------------------------------------------------- CEL rules


def cel_rule(rule: Rule) -> dict[str, Any]:
    """One row of the cross-field table (colocgrpo_training.rules) as an x-kubernetes-validations entry, on the
    spec or on each item of the rule's scope: `{arg}` becomes the field's value (its default where left out),
    `{arg?}` whether it is set, and the message the same words `colocgrpo validate` says, values included."""
    if rule.cel is None:
        raise ValueError(f"the rule {rule.name!r} has no CEL form")
    prefix = f"spec.{rule.scope}[]." if rule.scope else "spec."

    def value(argument: str) -> str:
        field = rule.fields[argument]
        if field.default is None:
            return f"self.{field.spec}"
        return f"({_present(field.spec)} ? self.{field.spec} : {json.dumps(field.default)})"

    def substitute(match: re.Match[str]) -> str:
        return _present(rule.fields[match.group(1)].spec) if match.group(2) else value(match.group(1))

    entry: dict[str, Any] = {"rule": _ARGUMENT.sub(substitute, rule.cel)}
    named = _FIELD_PATH.sub(lambda m: prefix + rule.fields[m.group(1)].spec, rule.message)
    if rule.reports is not None:
        named = f"{prefix}{rule.fields[rule.reports].spec} {named}"
    arguments = _MESSAGE_VALUE.findall(named)
    if not arguments:
        entry["message"] = named
    else:  # the values through the strings library's format(): the API server's cost estimate of a concatenation
        # with string() exceeds its budget, whatever the values' bounds
        template = json.dumps(_MESSAGE_VALUE.sub("%s", named.replace("%", "%%")), ensure_ascii=False)
        entry["messageExpression"] = f"{template}.format([{', '.join(value(a) for a in arguments)}])"
    if rule.reports is not None:
        entry["fieldPath"] = f".{rule.fields[rule.reports].spec}"
    entry["reason"] = rule.reason
    return entry


_ARGUMENT = re.compile(r"\{(\w+)(\?)?\}")
_FIELD_PATH = re.compile(r"<(\w+)>")
_MESSAGE_VALUE = re.compile(r"\{(\w+)\}")


def _present(path: str) -> str:
    """CEL that is true where every part of `path` is set."""
    parts = path.split(".")
    return "(" + " && ".join(f"has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts))) + ")"


def _cel_rules(scope: str) -> list[dict[str, Any]]:
    """The CEL form of every rule of that scope that has one; the others (trainerArgs' untyped values) are
    `colocgrpo validate`'s and the operator's alone."""
    return [cel_rule(rule) for rule in RULES if rule.scope == scope and rule.cel is not None]


def _name_trainer_args(schema: dict[str, Any]) -> None:
    """trainer_args.trainer_args_problems for the keys, in the schema: trainerArgs lists every
    GRPOConfig argument that no typed field sets, each of any value. Any other key is an unknown
    field, refused like any other (kubectl's strict field validation; a client that does not ask
    for it has the key dropped), so the operator never meets one. No CEL: the API server cannot
    build CEL declarations for untyped values, and then leaves trainerArgs out of its parent's."""
    value = schema.pop("additionalProperties")
    allowed = sorted(grpo_config_fields() - set(OWNED_KEYS) - set(REFUSED_KEYS) - set(RENAMED_KEYS))
    schema["properties"] = {key: dict(value) for key in allowed}


def _root_rules(spec_schema: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [
        {
            "rule": f"self.metadata.name.size() <= {MAX_JOB_NAME_LENGTH}",
            "message": f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters "
            "(it names the Service and every pod hostname <name>-<index>)",
            "fieldPath": ".metadata.name",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"self.metadata.name.matches('{DNS_1035_LABEL_PATTERN}')",
            "message": "metadata.name must be a DNS-1035 label: lower-case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit",
            "fieldPath": ".metadata.name",
            "reason": "FieldValueInvalid",
        },
    ]
    # Immutability once started (status.startTime set by the operator). Updates through
    # the main resource cannot change status, so oldSelf.status is the truth here.
    started = "has(oldSelf.status) && has(oldSelf.status.startTime)"
    mutable = {field for parent, field in MUTABLE_AFTER_START}

    def unchanged(path: str, field: str) -> str:
        return (
            f"(has(self.{path}.{field}) == has(oldSelf.{path}.{field})) && "
            f"(!has(self.{path}.{field}) || self.{path}.{field} == oldSelf.{path}.{field})"
        )

    immutable_message = (
        "is immutable once the job has started "
        "(only spec.runPolicy.suspend and spec.runPolicy.ttlSecondsAfterFinished may change)"
    )
    for field in spec_schema["properties"]:
        # runPolicy has its own rule below; trainerArgs' untyped values cannot be compared in
        # CEL (the CRD would not install), so its immutability is left to the model's check.
        if field in ("runPolicy", "trainerArgs"):
            continue
        rules.append(
            {
                "rule": f"!({started}) || {unchanged('spec', field)}",
                "message": f"spec.{field} {immutable_message}",
                "fieldPath": f".spec.{field}",
                "reason": "FieldValueForbidden",
            }
        )
    run_fields = [f for f in spec_schema["properties"]["runPolicy"]["properties"] if f not in mutable]
    run_unchanged = " && ".join(unchanged("spec.runPolicy", f) for f in run_fields)
    rules.append(
        {
            "rule": f"!({started}) || !has(self.spec.runPolicy) || !has(oldSelf.spec.runPolicy) || ({run_unchanged})",
            "message": f"spec.runPolicy.{{{', '.join(run_fields)}}} {immutable_message}",
            "fieldPath": ".spec.runPolicy",
            "reason": "FieldValueForbidden",
        }
    )
    return rules


# ----------------------------------------------------------------------------- the CRD

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.resources.nodes"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.workers.gpus", "description": "GPUs held by active pods"},
    {"name": "TP", "type": "integer", "jsonPath": ".spec.vllm.tensorParallelSize"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.metrics.reward"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Whole-gang restarts"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # `kubectl get cgj -o wide`: why the job is in its phase (Unschedulable, ImagePullBackOff, OOMKilled,
    # InvalidSpec, ...). The Running condition carries that reason in every phase.
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Running")].reason',
        "priority": 1,
        "description": "Why the job is in its phase (the Running condition's reason)",
    },
]


def generate_crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition for ColocGRPOJob."""
    spec_schema = model_schema(ColocGRPOJobSpec, keep_defaults=True)
    status_schema = model_schema(ColocGRPOJobStatus, keep_defaults=False)
    spec_schema["x-kubernetes-validations"] = _cel_rules("")
    _name_trainer_args(spec_schema["properties"]["trainerArgs"])
    for scope in sorted({rule.scope for rule in RULES if rule.scope}):
        node = spec_schema
        for part in scope.split("."):
            node = node["properties"][part]
        node["items"]["x-kubernetes-validations"] = _cel_rules(scope)
    root = {
        "type": "object",
        "description": "A GRPO training run: vLLM colocated in DeepSpeed ZeRO-3 training processes.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declaring metadata.name (the only field a CRD may constrain besides generateName)
            # makes `.metadata.name` a valid fieldPath for the root rules below.
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": _root_rules(spec_schema),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": OPERATOR_NAME}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["colocgrpo"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


# Helm leaves an object with this annotation in place on `helm uninstall` (and when a chart drops it): deleting
# the CRD would delete every ColocGRPOJob in the cluster, and with them their pods and checkpoints' owners.
HELM_KEEP = {"helm.sh/resource-policy": "keep"}


def crd_yaml(*, helm_template: bool = False) -> str:
    """The CRD as YAML: plain (the operator chart's crds/, for kubectl), or as the colocgrpo-crds chart's
    template, which Helm installs and upgrades like any other object of a release and never deletes."""
    import yaml

    crd = generate_crd()
    if helm_template:
        crd["metadata"]["annotations"] = dict(HELM_KEEP)
        header = (
            "# Generated by `colocgrpo crd --helm-template` (make crd) from colocgrpo_operator.api; do not edit.\n"
            "# The colocgrpo-crds chart: `helm upgrade` applies this file; `helm uninstall` leaves the CRD in place.\n"
        )
    else:
        header = "# Generated by `colocgrpo crd` (make crd) from colocgrpo_operator.api; do not edit by hand.\n"
    text = yaml.safe_dump(crd, sort_keys=False, width=120)
    if helm_template and "{{" in text:
        raise ValueError("the CRD contains '{{', which Helm would read as a template action")
    return header + text


def structural_problems(schema: dict[str, Any], path: str = "") -> list[str]:
    """Violations of Kubernetes' structural-schema rules (what the API server would reject)."""
    problems: list[str] = []
    where = path or "<root>"
    free = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string")
    if not schema.get("type") and not free:
        problems.append(f"{where}: no type")
    if schema.get("x-kubernetes-int-or-string"):
        if "type" in schema or schema.get("anyOf") != [{"type": "integer"}, {"type": "string"}]:
            problems.append(f"{where}: int-or-string must be anyOf [integer, string] without type")
    elif any(k in schema for k in ("anyOf", "oneOf", "allOf", "not")):
        problems.append(f"{where}: value validation combinators are not used in this CRD")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{where}: properties and additionalProperties are mutually exclusive")
    if "$ref" in schema or "title" in schema:
        problems.append(f"{where}: $ref/title left over")
    if schema.get("nullable") is True and "default" in schema and schema["default"] is None:
        problems.append(f"{where}: null default")
    for name, sub in (schema.get("properties") or {}).items():
        problems.extend(structural_problems(sub, f"{path}.{name}"))
    if isinstance(schema.get("additionalProperties"), dict):
        problems.extend(structural_problems(schema["additionalProperties"], f"{path}[*]"))
    if isinstance(schema.get("items"), dict):
        problems.extend(structural_problems(schema["items"], f"{path}[]"))
    return problems
