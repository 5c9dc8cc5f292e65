"""Turning an untrusted object into a ColocGRPOJob, with every problem named by field path.

The API server enforces the same rules through the CRD schema and CEL (api/crd.py);
this module is what the CLI (`colocgrpo validate`) and the operator use, so a user sees
identical messages offline and in the job's SpecValid condition.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from colocgrpo_operator.api.model import (
    ABSOLUTE_PATH_PATTERN,
    BUILTIN_REWARDS,
    DNS_SUBDOMAIN_PATTERN,
    MODULE_FUNCTION_PATTERN,
    ColocGRPOJob,
    ColocGRPOJobSpec,
)
from colocgrpo_operator.api.naming import (
    API_VERSION,
    CONFIG_MOUNT_DIR,
    DNS_1035_LABEL_PATTERN,
    KIND,
    MAX_JOB_NAME_LENGTH,
    OPERATOR_VOLUMES,
    REWARD_MODULES_DIR,
    SHM_DIR,
    TMP_DIR,
)
from colocgrpo_operator.api.queueing import queue_problems
from colocgrpo_operator.api.trainer_args import trainer_args_problems
from colocgrpo_training.rules import RULES, Field, spec_path

# BUILTIN_REWARDS (the trainer's built-ins) lives in api/model.py, whose CRD pattern names them.
_MODULE_FUNCTION = re.compile(MODULE_FUNCTION_PATTERN)


class JobSpecError(ValueError):
    """A ColocGRPOJob that cannot run; `errors` lists (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(self.lines()))

    def lines(self) -> list[str]:
        # A problem with the whole document (not a mapping) has no field path: no leading ": ".
        return [f"{path}: {message}" if path else message for path, message in self.errors]


IMMUTABLE_AFTER_START = (
    "is immutable once the job has started (only runPolicy.suspend and runPolicy.ttlSecondsAfterFinished may change)"
)


def format_location(loc: tuple[Any, ...]) -> str:
    """('spec', 'rewards', 0, 'weight') -> 'spec.rewards[0].weight'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


# Pydantic reports union alternatives as extra location parts (e.g. 'int', 'str',
# 'constrained-str'); they mean nothing to a user.
_UNION_TAGS = re.compile(r"^(int|str|float|bool|constrained-str|function-after\[.*\]|list\[.*\]|dict\[.*\])$")


PATTERN_MEANINGS = {
    DNS_SUBDOMAIN_PATTERN: "must be a Kubernetes object name: lower-case letters, digits, '-' and '.', "
    "starting and ending with a letter or digit",
    ABSOLUTE_PATH_PATTERN: "must be an absolute path",
}


def pydantic_problems(error: ValidationError) -> list[tuple[str, str]]:
    """(field path, message) of each of the model's complaints, worded for a user."""
    problems: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for item in error.errors(include_url=False):
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and _UNION_TAGS.match(p)))
        message = item["msg"]
        if item["type"] == "string_pattern_mismatch":
            pattern = (item.get("ctx") or {}).get("pattern", "")
            message = PATTERN_MEANINGS.get(pattern, message)
        elif item["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "required field is missing"
        problem = (format_location(loc), message)
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)
    return problems


def name_problems(name: Any) -> list[tuple[str, str]]:
    if name is None or name == "":
        return [("metadata.name", "required field is missing")]
    if not isinstance(name, str):
        return [("metadata.name", f"must be a string, got {type(name).__name__}")]
    problems = []
    if len(name) > MAX_JOB_NAME_LENGTH:
        problems.append(
            (
                "metadata.name",
                f"must be at most {MAX_JOB_NAME_LENGTH} characters (it names the Service and every pod "
                f"hostname <name>-<index>), got {len(name)}",
            )
        )
    if not re.match(DNS_1035_LABEL_PATTERN, name):
        problems.append(
            (
                "metadata.name",
                "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a letter "
                "and ending with a letter or digit",
            )
        )
    return problems


def _pod_template_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """User volumes and mounts must not collide with the ones the operator puts in every pod (the
    API server would refuse the whole Job, far from the field that caused it)."""
    problems: list[tuple[str, str]] = []
    for index, volume in enumerate(spec.pod_template.volumes):
        if volume.name in OPERATOR_VOLUMES:
            problems.append(
                (
                    f"spec.podTemplate.volumes[{index}].name",
                    f"{volume.name!r} is a volume the operator adds to every pod "
                    f"({', '.join(OPERATOR_VOLUMES)}); pick another name",
                )
            )
    ours = {
        CONFIG_MOUNT_DIR: "the job's ConfigMap",
        SHM_DIR: "shared memory",
        spec.checkpoint.path.rstrip("/") or "/": "spec.checkpoint.path",
        spec.cache.path.rstrip("/") or "/": "spec.cache.path",
        TMP_DIR: "scratch space",
    }
    if spec.reward_modules:
        ours[REWARD_MODULES_DIR] = "spec.rewardModules"
    for index, mount in enumerate(spec.pod_template.volume_mounts):
        path = mount.mount_path.rstrip("/") or "/"
        if path in ours:
            problems.append(
                (
                    f"spec.podTemplate.volumeMounts[{index}].mountPath",
                    f"{mount.mount_path} is already mounted by the operator ({ours[path]}); mount elsewhere",
                )
            )
    return problems


def rule_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """(field path, message) for every cross-field rule of the table (colocgrpo_training.rules) the spec breaks:
    the rules the CRD's CEL runs, in the same words."""
    problems: list[tuple[str, str]] = []
    for rule in RULES:
        items = enumerate(_field_value(spec, rule.scope) or []) if rule.scope else [(None, spec)]
        for index, item in items:
            where = f"spec.{rule.scope}[{index}]" if rule.scope else "spec"
            values = {arg: _field_value(item, field.spec) for arg, field in rule.fields.items()}
            found = rule.problem(values, functools.partial(_path_under, where), where)
            if found is not None:
                problems.append(found)
    return problems


def _path_under(where: str, field: Field) -> str:
    return f"{where}.{field.spec}"


def _field_value(node: Any, path: str) -> Any:
    """The value at a camelCase path of the typed spec (trainerArgs by key); None where it is left out."""
    for part in path.split("."):
        if isinstance(node, BaseModel):
            node = getattr(node, _attribute_names(type(node)).get(part, part), None)
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


@functools.cache
def _attribute_names(model: type[BaseModel]) -> dict[str, str]:
    """A model's field names by their camelCase alias."""
    return {info.alias or name: name for name, info in model.model_fields.items()}


def spec_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """Rules that involve more than one field (the schema checks single fields)."""
    problems = rule_problems(spec)
    problems.extend(_pod_template_problems(spec))
    for index, reward in enumerate(spec.rewards):
        if reward.function not in BUILTIN_REWARDS and not _MODULE_FUNCTION.match(reward.function):
            problems.append(
                (
                    f"spec.rewards[{index}].function",
                    f"{reward.function!r} is neither a built-in reward ({', '.join(sorted(BUILTIN_REWARDS))}) "
                    "nor module:function",
                )
            )
    problems.extend(trainer_args_problems(spec.trainer_args))
    return problems


def _raw_rule_problems(spec_obj: Any) -> list[tuple[str, str]]:
    """The table's rules on a spec that failed type validation elsewhere, each where its own fields are sound (left
    out, or of a value their type admits), so that one run of `validate` shows every problem."""
    if not isinstance(spec_obj, dict):
        return []
    problems: list[tuple[str, str]] = []
    for rule in RULES:
        if rule.scope:
            continue
        values = {arg: _raw_value(spec_obj, field) for arg, field in rule.fields.items()}
        if all(value is not _UNSOUND for value in values.values()):
            found = rule.problem(values, spec_path, "spec")
            if found is not None:
                problems.append(found)
    return problems


_UNSOUND = object()


def _raw_value(spec_obj: dict[str, Any], field: Field) -> Any:
    """The field's value in a raw spec as its type reads it (strictly, as the API server does), its default where
    it is left out, or `_UNSOUND`."""
    node: Any = spec_obj
    model: type[BaseModel] | None = ColocGRPOJobSpec
    leaf: tuple[type[BaseModel], str] | None = None
    for part in field.spec.split("."):
        if not isinstance(node, dict):
            return _UNSOUND
        node = node.get(part)
        if model is None:  # inside trainerArgs: TRL's values, of any type
            leaf = None
            continue
        name = _attribute_names(model).get(part, part)
        info = model.model_fields.get(name)
        if info is None:
            return _UNSOUND
        leaf = (model, name)
        section = info.annotation
        model = section if isinstance(section, type) and issubclass(section, BaseModel) else None
        if node is None:
            return field.default
    if leaf is None:
        return node
    try:
        return _field_adapter(*leaf).validate_json(json.dumps(node), strict=True)
    except (TypeError, ValueError):  # not JSON, or not of the field's type (pydantic's ValidationError)
        return _UNSOUND


@functools.cache
def _field_adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    info = model.model_fields[name]
    kind: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(kind)


# Kubernetes' own rules for label and annotation keys (a qualified name) and label values, which
# the API server applies to every object.
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _key_problem(key: Any) -> str | None:
    if not isinstance(key, str):
        return "must be a string"
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix must be a DNS subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return f"{key!r}: the name part must be 63 characters at most, alphanumeric, '-', '_' or '.' between"
    return None


def metadata_problems(metadata: dict[str, Any]) -> list[tuple[str, str]]:
    """Label and annotation keys and label values as the API server checks them on any object."""
    problems: list[tuple[str, str]] = []
    for field in ("labels", "annotations"):
        entries = metadata.get(field)
        if not isinstance(entries, dict):
            continue
        for key, value in entries.items():
            if (problem := _key_problem(key)) is not None:
                problems.append((f"metadata.{field}", problem))
            elif field == "labels" and isinstance(value, str) and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                problems.append(
                    (f"metadata.labels.{key}", "must be 63 characters at most, alphanumeric, '-', '_' or '.'")
                )
    return problems


def parse_job(obj: Any) -> ColocGRPOJob:
    """Validate a ColocGRPOJob given as a dict (from YAML or the API server).

    Raises JobSpecError listing every problem found, each with its field path.
    """
    if not isinstance(obj, dict):
        raise JobSpecError([("", f"a ColocGRPOJob must be a mapping, got {type(obj).__name__}")])
    problems: list[tuple[str, str]] = []
    if obj.get("apiVersion", API_VERSION) != API_VERSION:
        problems.append(("apiVersion", f"must be {API_VERSION}, got {obj.get('apiVersion')!r}"))
    if obj.get("kind", KIND) != KIND:
        problems.append(("kind", f"must be {KIND}, got {obj.get('kind')!r}"))
    metadata = meta if isinstance(meta := obj.get("metadata"), dict) else {}
    problems.extend(name_problems(metadata.get("name")))
    problems.extend(metadata_problems(metadata))
    labels = meta_labels if isinstance(meta_labels := metadata.get("labels"), dict) else {}
    raw_spec = raw if isinstance(raw := obj.get("spec"), dict) else {}
    scheduling = raw if isinstance(raw := raw_spec.get("scheduling"), dict) else {}
    problems.extend(queue_problems(labels, scheduling))
    try:
        job = ColocGRPOJob.model_validate(obj)
    except ValidationError as error:
        problems.extend(pydantic_problems(error))
        # Report trainerArgs key problems too, so one run of `validate` shows everything.
        raw_args = spec_obj.get("trainerArgs") if isinstance(spec_obj := obj.get("spec"), dict) else None
        if isinstance(raw_args, dict):
            problems.extend(trainer_args_problems(raw_args))
        problems.extend(_raw_rule_problems(spec_obj))
        raise JobSpecError(problems) from None
    problems.extend(spec_problems(job.spec))
    if problems:
        raise JobSpecError(problems)
    return job


# ----------------------------------------------------------------------------- immutability

# Fields a user may change after the gang started; everything else under spec is frozen
# (see docs/decisions.md, "Spec immutability").
MUTABLE_AFTER_START = (("runPolicy", "suspend"), ("runPolicy", "ttlSecondsAfterFinished"))


def has_started(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("startTime"))


def spec_change_problems(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """Changes to an already-started job's spec that are not allowed (same rule as the CRD's CEL)."""
    if not has_started(old):
        return []
    old_spec = dict(old.get("spec") or {})
    new_spec = dict(new.get("spec") or {})
    old_run = dict(old_spec.pop("runPolicy", None) or {})
    new_run = dict(new_spec.pop("runPolicy", None) or {})
    for _, field in MUTABLE_AFTER_START:
        old_run.pop(field, None)
        new_run.pop(field, None)
    problems = []
    for key in sorted(set(old_spec) | set(new_spec)):
        if old_spec.get(key) != new_spec.get(key):
            problems.append(
                (
                    f"spec.{key}",
                    IMMUTABLE_AFTER_START,
                )
            )
    for key in sorted(set(old_run) | set(new_run)):
        if old_run.get(key) != new_run.get(key):
            problems.append(
                (
                    f"spec.runPolicy.{key}",
                    IMMUTABLE_AFTER_START,
                )
            )
    return problems
