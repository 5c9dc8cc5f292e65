"""Runtimes: what a platform's admins set once for many jobs, and how a job's spec is merged with it.

A `ColocGRPORuntime` (namespaced) or `ClusterColocGRPORuntime` (cluster-scoped) carries a `template`: the part
of a job's spec that admins own (image, pod template additions, scheduling, cache claim, secrets, defaults for
vLLM, DeepSpeed, resources and the run policy), each field of the job's own type. A job names one in
`spec.runtimeRef`; its spec is the runtime's template with the job's own fields over it (`merge_spec`), and
that merged spec is validated as a whole (`parse_job`). `lockedFields` names template fields no job may
override: a job that sets one to another value is refused, naming the field.

A job field counts as set when it differs from the API's default: the API server fills defaults into every
stored job, so a value equal to the default cannot be told from one left out (a job cannot override a
runtime's value back to the default; the runtime then leaves that field unset).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from colocgrpo_operator.api.model import (
    CLUSTER_RUNTIME_KIND,
    MAX_LIST_ITEMS,
    RUNTIME_KIND,
    CacheSpec,
    DeepSpeedSpec,
    ImageReference,
    ObjectMeta,
    PodTemplateSpec,
    ResourcesSpec,
    RunPolicySpec,
    SchedulingSpec,
    SecretsSpec,
    VLLMSpec,
    _Spec,
)
from colocgrpo_operator.api.naming import GROUP, VERSION

RUNTIME_PLURAL = "colocgrporuntimes"
CLUSTER_RUNTIME_PLURAL = "clustercolocgrporuntimes"
RUNTIME_SHORT_NAMES = {RUNTIME_KIND: ["cgrt"], CLUSTER_RUNTIME_KIND: ["ccgrt"]}


class RuntimeTemplate(_Spec):
    """The part of a job's spec a runtime sets: each field of the job's type, all optional."""

    image: ImageReference | None = Field(default=None, description="Trainer image (the job's spec.image).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Trainer container imagePullPolicy."
    )
    resources: ResourcesSpec | None = Field(default=None, description="Defaults of the job's spec.resources.")
    vllm: VLLMSpec | None = Field(default=None, description="Defaults of the job's spec.vllm.")
    deepspeed: DeepSpeedSpec | None = Field(default=None, description="Defaults of the job's spec.deepspeed.")
    cache: CacheSpec | None = Field(default=None, description="The Hugging Face cache: its claim, path, offline.")
    secrets: SecretsSpec | None = Field(default=None, description="Secrets of the job's namespace for the trainer.")
    scheduling: SchedulingSpec | None = Field(
        default=None, description="Node selector, tolerations, affinity, priority class, Kueue settings."
    )
    pod_template: PodTemplateSpec | None = Field(
        default=None, description="Pod additions: env, volumes, mounts, labels, annotations, security."
    )
    run_policy: RunPolicySpec | None = Field(default=None, description="Defaults of the job's spec.runPolicy.")


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every camelCase path of `model`'s typed fields, down to the leaves (not into free-form objects)."""
    paths = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        path = f"{prefix}{alias}"
        paths.append(path)
        inner = _model_of(field.annotation)
        if inner is not None:
            paths.extend(_field_paths(inner, f"{path}."))
    return paths


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, _Spec):
            return candidate
    return None


# What `lockedFields` may name: any path of the template, e.g. image, scheduling.tolerations,
# podTemplate.podSecurity.level.
LOCKABLE_FIELDS = tuple(_field_paths(RuntimeTemplate))


class ColocGRPORuntimeSpec(_Spec):
    """What admins set once for the jobs that name this runtime."""

    template: RuntimeTemplate = Field(
        default_factory=RuntimeTemplate,
        description="Job spec fields this runtime sets; a job's own fields override them, except locked ones.",
    )
    locked_fields: Annotated[list[Literal[LOCKABLE_FIELDS]], Field(max_length=MAX_LIST_ITEMS)] = Field(  # type: ignore[valid-type]
        default_factory=list,
        description="Template fields (paths under template, e.g. image or scheduling.tolerations) that a job "
        "may not set to another value; such a job is refused naming the field.",
    )


class ColocGRPORuntime(_Spec):
    """A runtime of one namespace: its jobs name it in spec.runtimeRef."""

    api_version: str = Field(default=f"{GROUP}/{VERSION}")
    kind: str = Field(default=RUNTIME_KIND)
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ColocGRPORuntimeSpec = Field(default_factory=ColocGRPORuntimeSpec)


class RuntimeSpecError(ValueError):
    """A runtime that cannot be used; `errors` lists (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{path}: {message}" if path else message for path, message in errors))


def parse_runtime(obj: Any) -> ColocGRPORuntime:
    """Validate a (Cluster)ColocGRPORuntime given as a dict; raises RuntimeSpecError naming each bad field."""
    from colocgrpo_operator.api.validation import pydantic_problems

    if not isinstance(obj, dict):
        raise RuntimeSpecError([("", f"a runtime must be a mapping, got {type(obj).__name__}")])
    problems: list[tuple[str, str]] = []
    if obj.get("kind") not in (RUNTIME_KIND, CLUSTER_RUNTIME_KIND):
        problems.append(("kind", f"must be {RUNTIME_KIND} or {CLUSTER_RUNTIME_KIND}, got {obj.get('kind')!r}"))
    try:
        runtime = ColocGRPORuntime.model_validate(obj)
    except ValidationError as error:
        raise RuntimeSpecError(problems + pydantic_problems(error)) from None
    if problems:
        raise RuntimeSpecError(problems)
    return runtime


# ----------------------------------------------------------------------------- merging

# Lists of named items: merged by name, the job's item replacing the runtime's of the same name.
_NAMED_LISTS = frozenset(
    {"podTemplate.env", "podTemplate.volumes", "podTemplate.volumeMounts", "podTemplate.imagePullSecrets"}
)
# Lists that add up: the runtime's items, then the job's that are not among them.
_ADDED_LISTS = frozenset({"scheduling.tolerations"})


def _defaults() -> dict[str, Any]:
    """The API's defaults of the sections a runtime sets, camelCase, as the API server fills them in."""
    sections: dict[str, type[BaseModel]] = {
        "resources": ResourcesSpec,
        "vllm": VLLMSpec,
        "deepspeed": DeepSpeedSpec,
        "cache": CacheSpec,
        "secrets": SecretsSpec,
        "scheduling": SchedulingSpec,
        "podTemplate": PodTemplateSpec,
        "runPolicy": RunPolicySpec,
    }
    return {key: model().model_dump(mode="json", by_alias=True, exclude_none=True) for key, model in sections.items()}


_DEFAULTS = _defaults()


def _at(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(part)
    return tree


def is_set(value: Any, default: Any) -> bool:
    """Whether a job's value counts as set: not left out, not empty, not the API's default."""
    return value is not None and value != default and value not in ({}, [])


def _merge(runtime: Any, job: Any, path: str) -> Any:
    default = _at(_DEFAULTS, path) if path else None
    if isinstance(runtime, Mapping) and isinstance(job, Mapping):
        merged = dict(runtime)
        for key, value in job.items():
            sub = f"{path}.{key}" if path else key
            merged[key] = _merge(runtime.get(key), value, sub) if key in runtime else value
        return merged
    if isinstance(runtime, list) and isinstance(job, list):
        if path in _NAMED_LISTS:
            names = {item.get("name") for item in job if isinstance(item, Mapping)}
            return [item for item in runtime if not (isinstance(item, Mapping) and item.get("name") in names)] + job
        if path in _ADDED_LISTS:
            return list(runtime) + [item for item in job if item not in runtime]
    return job if is_set(job, default) or runtime is None else runtime


def locked_problems(runtime: ColocGRPORuntimeSpec, job_spec: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    """The locked fields the job sets to another value than the runtime's: (field path, message) pairs."""
    template = runtime.template.model_dump(mode="json", by_alias=True, exclude_unset=True)
    problems = []
    for path in runtime.locked_fields:
        mine, theirs = _at(job_spec, path), _at(template, path)
        if is_set(mine, _at(_DEFAULTS, path)) and mine != theirs:
            shown = "leaves it unset" if theirs is None else f"sets it to {theirs!r}"
            problems.append((f"spec.{path}", f"is locked by {where} (which {shown}); remove it from the job"))
    return problems


def merge_spec(runtime: ColocGRPORuntimeSpec, job_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The job's spec over the runtime's template (camelCase dicts): maps merge key by key, the job's
    set values win (`is_set`), env/volumes/volumeMounts/imagePullSecrets merge by name, tolerations add up,
    other lists are the job's when it sets them."""
    template = runtime.template.model_dump(mode="json", by_alias=True, exclude_unset=True)
    merged = _merge(template, dict(job_spec), "")
    assert isinstance(merged, dict)
    return merged


def runtime_label(kind: str, name: str, namespace: str | None) -> str:
    """How messages name a runtime: `ClusterColocGRPORuntime gpu-h100` or `ColocGRPORuntime team/gpu`."""
    return f"{kind} {name}" if kind == CLUSTER_RUNTIME_KIND else f"{kind} {namespace}/{name}"


def resolve_job(
    job_obj: Mapping[str, Any], runtime_obj: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The job as it runs with its runtime: (the job object with the merged spec, problems).

    Problems are the runtime's own (a runtime that does not validate) and the locked fields the job
    overrides; the merged job is validated as a whole by the caller (`parse_job`).
    """
    meta = runtime_obj.get("metadata") or {}
    where = runtime_label(str(runtime_obj.get("kind")), str(meta.get("name")), meta.get("namespace"))
    try:
        runtime = parse_runtime(dict(runtime_obj))
    except RuntimeSpecError as error:
        return dict(job_obj), [("spec.runtimeRef", f"{where} is invalid: {error}")]
    spec = dict(job_obj.get("spec") or {})
    problems = locked_problems(runtime.spec, spec, where)
    return {**job_obj, "spec": merge_spec(runtime.spec, spec)}, problems


def job_runtime_ref(job_obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the runtime a job names, or None."""
    ref = (job_obj.get("spec") or {}).get("runtimeRef")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
        return None
    return str(ref.get("kind") or CLUSTER_RUNTIME_KIND), ref["name"]


# ----------------------------------------------------------------------------- the CRDs


def generate_runtime_crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of ColocGRPORuntime (namespaced) or ClusterColocGRPORuntime (cluster-scoped).

    No defaults in the schema: a runtime sets only what its author wrote, so that a job's fields and the
    API's defaults fill in the rest (`merge_spec`)."""
    from colocgrpo_operator.api.crd import cel_rule, model_schema
    from colocgrpo_operator.api.naming import OPERATOR_NAME
    from colocgrpo_training.rules import RULES

    cluster = kind == CLUSTER_RUNTIME_KIND
    plural = CLUSTER_RUNTIME_PLURAL if cluster else RUNTIME_PLURAL
    spec_schema = model_schema(ColocGRPORuntimeSpec, keep_defaults=False)
    template = spec_schema["properties"]["template"]
    tolerations = template["properties"]["scheduling"]["properties"]["tolerations"]["items"]
    # A toleration's rules, from the one table of cross-field rules, as on a job's tolerations.
    tolerations["x-kubernetes-validations"] = [
        cel_rule(rule) for rule in RULES if rule.scope == "scheduling.tolerations" and rule.cel is not None
    ]
    scope = "every namespace's jobs" if cluster else "the jobs of its namespace"
    root = {
        "type": "object",
        "description": f"What admins set once for {scope}: image, pod additions, cache, secrets, queue, defaults.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/name": OPERATOR_NAME}},
        "spec": {
            "group": GROUP,
            "scope": "Cluster" if cluster else "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": plural[:-1],
                "shortNames": RUNTIME_SHORT_NAMES[kind],
                "categories": ["colocgrpo"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": [
                        {"name": "Image", "type": "string", "jsonPath": ".spec.template.image"},
                        {"name": "Locked", "type": "string", "jsonPath": ".spec.lockedFields"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def generate_runtime_crds() -> list[dict[str, Any]]:
    """Both runtime CRDs: the namespaced one, then the cluster-scoped one."""
    return [generate_runtime_crd(RUNTIME_KIND), generate_runtime_crd(CLUSTER_RUNTIME_KIND)]


# ----------------------------------------------------------------------------- a job with its runtime

RuntimeKey = tuple[str, str]  # (kind, name)


def runtimes_by_key(documents: list[Any]) -> dict[RuntimeKey, dict[str, Any]]:
    """The runtime documents among `documents`, by (kind, name)."""
    found = {}
    for document in documents:
        if isinstance(document, dict) and document.get("kind") in (RUNTIME_KIND, CLUSTER_RUNTIME_KIND):
            name = (document.get("metadata") or {}).get("name")
            if isinstance(name, str):
                found[(str(document["kind"]), name)] = document
    return found


def with_runtime(job_obj: Any, runtimes: Mapping[RuntimeKey, Mapping[str, Any]]) -> Any:
    """The job object as it runs: merged with the runtime its spec.runtimeRef names (`resolve_job`), or as
    it is when it names none. Raises JobSpecError when the runtime is not among `runtimes`, is invalid, or
    has a locked field the job overrides; the merged job is for `parse_job` to validate as a whole."""
    from colocgrpo_operator.api.validation import JobSpecError

    if not isinstance(job_obj, dict) or (ref := job_runtime_ref(job_obj)) is None:
        return job_obj
    runtime = runtimes.get(ref)
    if runtime is None:
        raise JobSpecError([("spec.runtimeRef", f"{ref[0]} {ref[1]} not found")])
    merged, problems = resolve_job(job_obj, runtime)
    if problems:
        raise JobSpecError(problems)
    return merged


def runtime_status(runtime_obj: Mapping[str, Any]) -> dict[str, Any]:
    """status.runtime for a job merged with this runtime: its kind, name and generation."""
    meta = runtime_obj.get("metadata") or {}
    status = {"kind": runtime_obj.get("kind"), "name": meta.get("name")}
    if isinstance(meta.get("generation"), int):
        status["generation"] = meta["generation"]
    return status


def runtime_crds_yaml(*, helm_template: bool = False) -> str:
    """Both runtime CRDs as one YAML stream: plain (the operator chart's crds/), or as the colocgrpo-crds
    chart's template, kept on `helm uninstall` like the job's CRD (api/crd.py, `crd_yaml`)."""
    import yaml

    from colocgrpo_operator.api.crd import HELM_KEEP

    crds = generate_runtime_crds()
    if helm_template:
        for crd in crds:
            crd["metadata"]["annotations"] = dict(HELM_KEEP)
    header = (
        "# Generated by `colocgrpo crd --runtimes"
        + (" --helm-template" if helm_template else "")
        + "` (make crd) from colocgrpo_operator.api; do not edit by hand.\n"
    )
    text = yaml.safe_dump_all(crds, sort_keys=False, width=120)
    if helm_template and "{{" in text:
        raise ValueError("the runtime CRDs contain '{{', which Helm would read as a template action")
    return header + text
