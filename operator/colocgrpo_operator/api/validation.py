"""Turning an untrusted object into a ColocGRPOJob, with every problem named by field path.

The API server enforces the same rules through the CRD schema and CEL (api/crd.py);
this module is what the CLI (`colocgrpo validate`) and the operator use, so a user sees
identical messages offline and in the job's SpecValid condition.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from colocgrpo_operator.api.model import (
    ABSOLUTE_PATH_PATTERN,
    BUILTIN_REWARDS,
    DNS_SUBDOMAIN_PATTERN,
    MODULE_FUNCTION_PATTERN,
    ColocGRPOJob,
    ColocGRPOJobSpec,
    ResourcesSpec,
    SleepPolicy,
    VLLMSpec,
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
from colocgrpo_operator.api.trainer_args import trainer_args_problems

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


def _parallelism_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    resources, vllm = spec.resources, spec.vllm
    if resources.gpus_per_node > 0 and resources.gpus_per_node % vllm.tensor_parallel_size != 0:
        problems.append(
            (
                "spec.vllm.tensorParallelSize",
                f"must divide spec.resources.gpusPerNode ({resources.gpus_per_node}): a tensor-parallel group "
                f"lives inside one node, got {vllm.tensor_parallel_size}",
            )
        )
    if resources.gpus_per_node == 0 and vllm.tensor_parallel_size != 1:
        problems.append(
            ("spec.vllm.tensorParallelSize", "must be 1 for a CPU job (spec.resources.gpusPerNode 0 runs no vLLM)")
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


# A toleration's cross-field rules, as the API server checks them on a pod: (CEL rule, message).
TOLERATION_RULES = (
    (
        "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
        "operator must be Exists when there is no key (which tolerates every taint)",
    ),
    (
        "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        "value must be empty when operator is Exists",
    ),
    (
        "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        "tolerationSeconds needs effect NoExecute",
    ),
)


def toleration_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """TOLERATION_RULES, in Python."""
    problems: list[tuple[str, str]] = []
    for index, toleration in enumerate(spec.scheduling.tolerations):
        path = f"spec.scheduling.tolerations[{index}]"
        if not toleration.key and toleration.operator != "Exists":
            problems.append((path, TOLERATION_RULES[0][1]))
        if toleration.operator == "Exists" and toleration.value:
            problems.append((path, TOLERATION_RULES[1][1]))
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            problems.append((path, TOLERATION_RULES[2][1]))
    return problems


def spec_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """Rules that involve more than one field (the schema checks single fields)."""
    problems = _parallelism_problems(spec)
    problems.extend(_pod_template_problems(spec))
    if spec.deepspeed.offload_params == "cpu" and spec.deepspeed.zero_stage != 3:
        problems.append(("spec.deepspeed.offloadParams", "parameter offload needs spec.deepspeed.zeroStage 3"))
    problems.extend(trainer_state_offload_problems(spec))
    problems.extend(toleration_problems(spec))
    for index, reward in enumerate(spec.rewards):
        if reward.function not in BUILTIN_REWARDS and not _MODULE_FUNCTION.match(reward.function):
            problems.append(
                (
                    f"spec.rewards[{index}].function",
                    f"{reward.function!r} is neither a built-in reward ({', '.join(sorted(BUILTIN_REWARDS))}) "
                    "nor module:function",
                )
            )
    problems.extend(_resume_problems(spec))
    problems.extend(trainer_args_problems(spec.trainer_args))
    vllm = spec.vllm
    max_completion = spec.trainer_args.get("max_completion_length")
    if (
        vllm.max_model_len is not None
        and isinstance(max_completion, int)
        and spec.dataset.max_prompt_tokens is not None
        and spec.dataset.max_prompt_tokens + max_completion > vllm.max_model_len
    ):
        problems.append(
            (
                "spec.vllm.maxModelLen",
                f"must be at least spec.dataset.maxPromptTokens + trainerArgs.max_completion_length "
                f"({spec.dataset.max_prompt_tokens} + {max_completion}), got {vllm.max_model_len}",
            )
        )
    return problems


# TrainingArguments.optim values that mean AdamW: with vllm.offloadTrainerState the rendered deepspeed.json
# names DeepSpeed's own AdamW, which transformers then uses whatever `optim` says.
ADAMW_OPTIMS = frozenset({"adamw_torch", "adamw_torch_fused"})


def trainer_state_offload_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    """What DeepSpeed 0.19's `offload_states` refuses or cannot gain from (docs/sleep-policy.md)."""
    if not spec.vllm.offload_trainer_state:
        return []
    field = "spec.vllm.offloadTrainerState"
    problems: list[tuple[str, str]] = []
    deepspeed = spec.deepspeed
    if deepspeed.zero_stage != 3:
        problems.append(
            (
                field,
                f"needs spec.deepspeed.zeroStage 3, got {deepspeed.zero_stage}: the offload is built and checked for "
                "ZeRO-3 only (DeepSpeed 0.19's stage-0 optimizers cannot move their state at all)",
            )
        )
    if deepspeed.offload_params != "none":
        problems.append(
            (
                field,
                "cannot be combined with spec.deepspeed.offloadParams cpu: DeepSpeed refuses to move the states "
                "of offloaded parameters (they are on the CPU already)",
            )
        )
    if spec.vllm.sleep_policy is SleepPolicy.OFF:
        problems.append(
            (
                field,
                "needs a sleeping spec.vllm.sleepPolicy (level1, level2 or auto): with off, vLLM never frees its "
                "memory, so the trainer state would never move",
            )
        )
    optim = spec.trainer_args.get("optim")
    if (
        deepspeed.offload_optimizer == "none"
        and optim is not None
        and not (isinstance(optim, str) and optim in ADAMW_OPTIMS)
    ):
        problems.append(
            (
                "spec.trainerArgs.optim",
                f"must be unset or one of {', '.join(sorted(ADAMW_OPTIMS))} with spec.vllm.offloadTrainerState: "
                f"the trainer then uses DeepSpeed's own AdamW, so that its state can move; got {optim!r}",
            )
        )
    return problems


MULTI_NODE_RESUME_NEEDS_A_CLAIM = (
    "is required when spec.resources.nodes is more than 1 and spec.checkpoint.resume is auto: every rank must "
    "resume from the same checkpoint, and without a claim each pod saves into its own emptyDir (set a claim "
    "that every pod mounts, ReadWriteMany, or spec.checkpoint.resume: never)"
)


def _resume_problems(spec: ColocGRPOJobSpec) -> list[tuple[str, str]]:
    checkpoint = spec.checkpoint
    if spec.resources.nodes > 1 and checkpoint.resume == "auto" and checkpoint.claim_name is None:
        return [("spec.checkpoint.claimName", MULTI_NODE_RESUME_NEEDS_A_CLAIM)]
    return []


def _raw_parallelism_problems(spec_obj: Any) -> list[tuple[str, str]]:
    """The tensor-parallel rule on a spec that failed type validation elsewhere, when its inputs are sound."""
    if not isinstance(spec_obj, dict):
        return []
    resources = section if isinstance(section := spec_obj.get("resources"), dict) else {}
    vllm = section if isinstance(section := spec_obj.get("vllm"), dict) else {}
    gpus, tp = resources.get("gpusPerNode", 1), vllm.get("tensorParallelSize", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpus, tp)) or gpus < 0 or tp < 1:
        return []
    partial = ColocGRPOJobSpec.model_construct(
        resources=ResourcesSpec.model_construct(gpus_per_node=gpus),
        vllm=VLLMSpec.model_construct(tensor_parallel_size=tp),
    )
    return _parallelism_problems(partial)


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
    try:
        job = ColocGRPOJob.model_validate(obj)
    except ValidationError as error:
        problems.extend(pydantic_problems(error))
        # Report trainerArgs key problems too, so one run of `validate` shows everything.
        raw_args = spec_obj.get("trainerArgs") if isinstance(spec_obj := obj.get("spec"), dict) else None
        if isinstance(raw_args, dict):
            problems.extend(trainer_args_problems(raw_args))
        problems.extend(_raw_parallelism_problems(spec_obj))
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
