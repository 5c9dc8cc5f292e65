"""The ColocGRPOJob API: one typed model for spec and status.

This model is the single source of truth. The CRD's openAPIV3Schema is generated from
it (api/crd.py), docs/api.md lists its fields, and the operator and the CLI validate
with it (api/validation.py). Field descriptions end up in `kubectl explain`.

Kubernetes-style camelCase names are aliases; Python code uses snake_case attributes.
`trainerArgs` is the one place with TRL's own snake_case names (passed through to
GRPOConfig).
"""

from __future__ import annotations

import enum
import re
import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel

from colocgrpo_operator.api.naming import TRAINER_GID, TRAINER_UID
from colocgrpo_training.config import SleepPolicy

# ----------------------------------------------------------------------------- building blocks

# Bounds used by the CRD so the API server can estimate the cost of CEL rules and so a
# hostile object cannot be arbitrarily large; generous for any real job.
MAX_SHORT_STRING = 253
MAX_LONG_STRING = 65536
MAX_LIST_ITEMS = 64
# Upper bounds of counts, so that what the API server admits is what the operator can run (a
# value past them is a typo, never a plan): the largest GPU nodes have 16 GPUs, the largest
# training gangs some thousands of nodes; token and step counts stay within 32 bits.
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_RESTARTS = 1000
MAX_TOKENS = 2**31 - 1
MAX_STEPS = 2**31 - 1
MAX_PARAMETERS = 10**15
MAX_UNIX_ID = 2**31 - 1
MAX_REWARD_WEIGHT = 1e6
# The largest GPUs hold a few hundred GiB: more is a typo, never a plan.
MAX_GPU_MEMORY_GIB = 4096
# A reward function: a built-in, or module:function from spec.rewardModules.
# The trainer's built-ins (colocgrpo_training.rewards.builtin, which the operator must not import;
# tests/api checks the two lists agree).
BUILTIN_REWARDS = frozenset({"accuracy", "format", "tag_count", "last_number"})
MODULE_FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# The same as one pattern, for the CRD (validation.spec_problems says which it is in words).
REWARD_FUNCTION_PATTERN = "^(" + "|".join(sorted(BUILTIN_REWARDS)) + "|" + MODULE_FUNCTION_PATTERN[1:-1] + ")$"
# The API server's integers are 64-bit.
INT64_RANGE = range(-(2**63), 2**63)
MAX_MAP_ENTRIES = 256

# Kubernetes resource quantity ("8", "32Gi", "500m", or a plain integer), never negative: every quantity here is a
# pod's request, limit or volume size, which the API server refuses below 0 on the Job.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > 64 or not _QUANTITY.match(value)):
        raise ValueError(f"must be a Kubernetes quantity such as 8, 500m or 32Gi, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"must not be negative, got {value}")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            # JSON Schema applies each to its own kind: the pattern to a string, the minimum to an integer.
            "pattern": QUANTITY_PATTERN,
            "minimum": 0,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

ShortString = Annotated[str, Field(min_length=1, max_length=MAX_SHORT_STRING)]
LongString = Annotated[str, Field(max_length=MAX_LONG_STRING)]
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
ABSOLUTE_PATH_PATTERN = r"^/"
DnsName = Annotated[str, Field(min_length=1, max_length=MAX_SHORT_STRING, pattern=DNS_SUBDOMAIN_PATTERN)]
StringMap = Annotated[dict[str, Annotated[str, Field(max_length=MAX_LONG_STRING)]], Field(max_length=MAX_MAP_ENTRIES)]
Timestamp = Annotated[str, Field(max_length=64, json_schema_extra={"format": "date-time"})]

# A container image reference as the distribution spec's reference grammar defines it
# (github.com/distribution/reference, regexp.go): [host[:port]/]path[:tag][@digest], path components in
# lowercase. The kubelet and containerd refuse anything else only when the pod starts (ErrImagePull, or a pod
# no kubelet can report on); the API server refuses it at the door, naming spec.image. \w is spelled out: RE2
# (the API server) and pydantic's Rust regex differ on Unicode there.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_PATTERN = (
    rf"^(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
)
ImageReference = Annotated[str, Field(min_length=1, max_length=MAX_SHORT_STRING, pattern=IMAGE_REFERENCE_PATTERN)]


def _free_form(description: str) -> Any:
    """A Kubernetes core type we pass through untouched (validated by the API server on the child)."""
    return WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description})


def _scalar_kinds(annotation: Any) -> set[type]:
    """The JSON scalar types (bool, int, float, str) a field of this type holds; empty for others."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _scalar_kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, type(int | str)):
        return set().union(*(_scalar_kinds(arg) for arg in typing.get_args(annotation) if arg is not type(None)))
    return {annotation} if annotation in (bool, int, float, str) else set()


def _json_type_problem(kinds: set[type], value: Any) -> str | None:
    """What the API server's schema would say of `value` for a field of these scalar kinds, where
    pydantic would convert it instead (true for 1, "3" for 3, "yes" for true)."""
    if not kinds or value is None:
        return None
    if isinstance(value, bool):
        return None if bool in kinds else f"must be {'a number' if kinds & {int, float} else 'a string'}, not {value}"
    if bool in kinds and kinds == {bool}:
        return f"must be true or false, not {value!r}"
    if isinstance(value, str) and str not in kinds:
        return f"must be a number, not the string {value!r}"
    if isinstance(value, int) and value not in INT64_RANGE:
        return f"{value} is out of the API's 64-bit integer range"
    return None


class _Spec(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _as_the_api_server_reads_it(cls, value: Any, info: ValidationInfo) -> Any:
        """Each field as the API server's schema reads it: a null is a field left out (its default
        applies); a value of another JSON type is refused where pydantic would convert it (true
        for 1, "3" for 3, "yes" for true)."""
        return _api_server_reading(cls, info.field_name, value)


class _KubernetesObject(BaseModel):
    """A Kubernetes core object we only name a few fields of; the rest passes through."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    @field_validator("*", mode="before")
    @classmethod
    def _as_the_api_server_reads_it(cls, value: Any, info: ValidationInfo) -> Any:
        """As `_Spec`'s, for the fields it names."""
        return _api_server_reading(cls, info.field_name, value)


def _api_server_reading(model: type[BaseModel], name: str | None, value: Any) -> Any:
    field = model.model_fields.get(name or "")
    if field is None:
        return value
    if value is None:
        return None if field.is_required() else field.get_default(call_default_factory=True)
    annotation, values = field.annotation, [value]
    if typing.get_origin(annotation) is dict and isinstance(value, dict):
        annotation, values = typing.get_args(annotation)[1], list(value.values())
        if _scalar_kinds(annotation):  # a map of quantities: its nulls are left out too
            value = {key: item for key, item in value.items() if item is not None}
            values = list(value.values())
    kinds = _scalar_kinds(annotation)
    for item in values:
        if (problem := _json_type_problem(kinds, item)) is not None:
            raise ValueError(problem)
    return value


# ----------------------------------------------------------------------------- spec


class ModelSpec(_Spec):
    """The policy model that GRPO trains (and vLLM serves)."""

    name: ShortString = Field(description="Hugging Face Hub id (e.g. Qwen/Qwen2.5-14B-Instruct) or a path in the pod.")
    revision: ShortString | None = Field(default=None, description="Hub revision: branch, tag or commit.")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        default="bfloat16", description="Weight dtype for training and vLLM."
    )
    attn_implementation: Literal["sdpa", "eager"] | None = Field(
        default=None,
        description=(
            "transformers attention implementation for training: sdpa (PyTorch's fused attention, which runs "
            "FlashAttention kernels on GPUs that have them) or eager; unset, transformers picks (sdpa). The trainer "
            "image ships no flash-attn package, so flash_attention_2 and flash_attention_3 are refused at admission "
            "rather than failing every pod at model load."
        ),
    )
    parameter_count: int | None = Field(
        default=None,
        gt=0,
        le=MAX_PARAMETERS,
        description="Number of parameters, for the memory planner when the config is not at hand.",
    )


class DatasetSpec(_Spec):
    """Prompts for GRPO."""

    name: ShortString = Field(
        description="Hugging Face Hub dataset id, or a local file/directory in the pod (jsonl, json, parquet)."
    )
    config: ShortString | None = Field(default=None, description="Dataset configuration name on the Hub.")
    split: ShortString = Field(default="train", description="Split to train on.")
    prompt_column: ShortString = Field(default="problem", description="Column holding the prompt text.")
    solution_column: ShortString = Field(
        default="solution", description="Column holding the gold answer (used by the accuracy reward)."
    )
    system_prompt: LongString | None = Field(default=None, description="System message put before every prompt.")
    chat_template: LongString | None = Field(
        default=None, description="Jinja chat template overriding the tokenizer's."
    )
    max_prompt_tokens: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="Prompts longer than this many tokens are truncated (from the left).",
    )


class ResourcesSpec(_Spec):
    """The gang: one pod per node, all GPUs of a node in that pod."""

    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="Number of pods (one per node); a job larger than the cluster is reported Unschedulable.",
    )
    gpus_per_node: int = Field(
        default=1,
        ge=0,
        le=MAX_GPUS_PER_NODE,
        description="nvidia.com/gpu per pod; also processes per pod. 0 makes a CPU job (no vLLM, no DeepSpeed).",
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=MAX_GPU_MEMORY_GIB,
        alias="gpuMemoryGiB",
        description="Memory per GPU in GiB, as torch's total_memory counts it (what vllm.gpuMemoryUtilization "
        "multiplies), for the memory plan and the trainer's micro-batch merge: set it for a GPU shared with other "
        "work or a MIG slice. Unset, the plan assumes 139.8 (an H200) and the trainer plans for its own GPU.",
    )
    cpu: Quantity | None = Field(default=None, description="CPU request and limit per pod.")
    memory: Quantity | None = Field(default=None, description="Memory request and limit per pod.")
    shared_memory: Quantity | None = Field(
        default=None,
        description="Size limit of the memory-backed /dev/shm (NCCL and dataloaders need more than the 64Mi default).",
    )
    extra: Annotated[dict[str, Quantity], Field(max_length=MAX_MAP_ENTRIES)] = Field(
        default_factory=dict,
        description="Extra resources per pod, requested and limited alike (e.g. rdma/hca_shared_devices_a: 1).",
    )


class VLLMSpec(_Spec):
    """vLLM colocated inside every training process (tensor-parallel within a node)."""

    tensor_parallel_size: int = Field(
        default=1, ge=1, le=MAX_GPUS_PER_NODE, description="vLLM tensor-parallel size; must divide gpusPerNode."
    )
    gpu_memory_utilization: float = Field(
        default=0.3, gt=0, lt=1, description="Fraction of the whole GPU vLLM may take (not of what is free)."
    )
    sleep_policy: SleepPolicy = Field(
        default=SleepPolicy.AUTO,
        description="What vLLM does with its memory between generations: off, level1, level2, auto.",
    )
    max_model_len: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS, description="vLLM context window (prompt + completion tokens)."
    )
    enable_prefix_caching: bool = Field(default=True, description="vLLM automatic prefix caching.")
    max_num_seqs: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS, description="vLLM's cap on concurrently scheduled sequences."
    )
    offload_trainer_state: bool = Field(
        default=False,
        description="Move the ZeRO-3 trainer state (16-bit weights and gradients, fp32 master weights, Adam "
        "moments) to pinned CPU memory while vLLM generates. Needs deepspeed.zeroStage 3 without offloadParams "
        "and a sleeping sleepPolicy; trains with DeepSpeed's own AdamW.",
    )


class DeepSpeedSpec(_Spec):
    """DeepSpeed ZeRO settings (ignored by CPU jobs)."""

    zero_stage: int = Field(default=3, ge=0, le=3, description="ZeRO stage 0-3.")
    offload_optimizer: Literal["none", "cpu"] = Field(default="none", description="Offload optimizer state.")
    offload_params: Literal["none", "cpu"] = Field(default="none", description="Offload parameters (ZeRO-3 only).")


# How many training micro-batches the trainer may merge into one: auto, off, or a factor.
MAX_MERGE_FACTOR = 1024
MERGE_MODES = ("auto", "off")
MERGE_PATTERN = "^(" + "|".join(MERGE_MODES) + ")$"


def _check_merge(value: int | str) -> int | str:
    if isinstance(value, str) and value not in MERGE_MODES:
        raise ValueError(f"must be auto, off or a merge factor (an integer from 1), got {value!r}")
    if isinstance(value, int) and not 1 <= value <= MAX_MERGE_FACTOR:
        raise ValueError(f"a merge factor must be from 1 to {MAX_MERGE_FACTOR}, got {value}")
    return value


MergeSetting = Annotated[
    int | str,
    AfterValidator(_check_merge),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            # JSON Schema applies each to its own kind: the pattern to a string, the bounds to an integer.
            "pattern": MERGE_PATTERN,
            "minimum": 1,
            "maximum": MAX_MERGE_FACTOR,
        }
    ),
]


class TrainingSpec(_Spec):
    """colocgrpo's own training options, beside TRL's trainerArgs."""

    micro_batch_merge: MergeSetting = Field(
        default="auto",
        description="Merge k training micro-batches into one where TRL computes the same step: auto (the largest "
        "k the memory plan leaves room for), off (trainerArgs' micro-batch as set), or k itself (it must divide "
        "gradient_accumulation_steps and steps_per_generation; memory unchecked).",
    )


class RewardSpec(_Spec):
    """One reward function and its weight."""

    function: Annotated[str, Field(min_length=1, max_length=MAX_SHORT_STRING)] = Field(
        json_schema_extra={"pattern": REWARD_FUNCTION_PATTERN},
        description="A built-in reward (accuracy, format, tag_count, ...) or module:function from rewardModules.",
    )
    weight: float = Field(
        default=1.0, ge=-MAX_REWARD_WEIGHT, le=MAX_REWARD_WEIGHT, description="Weight of this reward in the sum."
    )


class RewardModulesSpec(_Spec):
    """User reward code: a ConfigMap whose files are mounted on the trainer's Python path."""

    config_map_name: DnsName = Field(
        description="ConfigMap in the job's namespace; each key is a file (e.g. my_rewards.py)."
    )


class CheckpointSpec(_Spec):
    """Where the trainer saves and resumes."""

    claim_name: DnsName | None = Field(
        default=None,
        description=(
            "PersistentVolumeClaim to save into, mounted by every pod (ReadWriteMany for several nodes). "
            "Without one, checkpoints live in an emptyDir and do not survive a restart; required with "
            "several nodes unless resume is never."
        ),
    )
    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH_PATTERN)] = Field(
        default="/checkpoints", description="Mount path of the checkpoint volume; the trainer's output_dir."
    )
    save_steps: int | None = Field(
        default=None,
        gt=0,
        le=MAX_STEPS,
        description="Save every N optimizer steps; unset = no intermediate checkpoints.",
    )
    save_total_limit: int | None = Field(
        default=2, gt=0, le=MAX_STEPS, description="Keep at most this many checkpoints."
    )
    resume: Literal["auto", "never"] = Field(
        default="auto", description="auto: resume from the latest checkpoint if one exists."
    )
    save_final_model: bool = Field(default=True, description="Save the final model in Hugging Face format.")


class SecretKeySelector(_Spec):
    name: DnsName = Field(description="Secret name in the job's namespace.")
    key: ShortString = Field(description="Key inside the Secret.")


class SecretsSpec(_Spec):
    """Secrets exposed to the trainer as environment variables, never copied into a ConfigMap."""

    hugging_face_token: SecretKeySelector | None = Field(default=None, description="Becomes HF_TOKEN.")


class CacheSpec(_Spec):
    """Hugging Face cache (models, datasets) inside the pods."""

    claim_name: DnsName | None = Field(
        default=None, description="PersistentVolumeClaim holding the cache; emptyDir without one."
    )
    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH_PATTERN)] = Field(
        default="/cache", description="Mount path; HF_HOME is <path>/huggingface."
    )
    offline: bool = Field(default=False, description="Set HF_HUB_OFFLINE/HF_DATASETS_OFFLINE: never reach the Hub.")


# Kubernetes' qualified names (label, annotation and taint keys) and label values.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class Toleration(_Spec):
    """A core/v1 Toleration, checked here as the API server checks a pod's (its cross-field rules are
    in colocgrpo_training.rules, which crd.py and validation.py read)."""

    key: Annotated[str, Field(max_length=MAX_SHORT_STRING, pattern=QUALIFIED_NAME_PATTERN)] | None = Field(
        default=None, description="Taint key; without one, operator Exists tolerates every taint."
    )
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (the default).")
    value: Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)] | None = Field(
        default=None, description="Taint value, for operator Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; every effect without one."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=365 * 24 * 3600, description="For effect NoExecute: how long the pod stays."
    )


class Affinity(_Spec):
    """A core/v1 Affinity: its three parts, each passed through to the pods as written."""

    node_affinity: Annotated[dict[str, Any] | None, _free_form("A core/v1 NodeAffinity.")] = None
    pod_affinity: Annotated[dict[str, Any] | None, _free_form("A core/v1 PodAffinity.")] = None
    pod_anti_affinity: Annotated[dict[str, Any] | None, _free_form("A core/v1 PodAntiAffinity.")] = None


class SchedulingSpec(_Spec):
    """Where the pods may run."""

    node_selector: StringMap = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: Annotated[list[Toleration], Field(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="Pod tolerations (core/v1 Toleration)."
    )
    affinity: Affinity | None = Field(default=None, description="Pod affinity (core/v1 Affinity).")
    priority_class_name: DnsName | None = Field(
        default=None,
        description="Pod priorityClassName (Kueue also takes the Workload's priority from it, when no "
        "workloadPriorityClassName is set).",
    )
    queue_name: DnsName | None = Field(
        default=None, description="Kueue LocalQueue: labels the Job and creates it suspended for Kueue to admit."
    )
    workload_priority_class_name: DnsName | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass: the Job's kueue.x-k8s.io/priority-class label, which sets the "
        "Workload's priority for queueing and preemption (not the pods' priority).",
    )


class EnvVar(_Spec):
    """A core/v1 EnvVar, checked here as the API server checks a container's."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_SHORT_STRING, pattern=r"^[ -<>-~]+$")] = Field(
        description="Variable name: printable ASCII, no '='."
    )
    value: Annotated[str, Field(max_length=MAX_LONG_STRING)] | None = Field(default=None, description="Its value.")
    value_from: Annotated[dict[str, Any] | None, _free_form("A core/v1 EnvVarSource.")] = Field(
        default=None, description="Where its value comes from instead (core/v1 EnvVarSource)."
    )


class Volume(_KubernetesObject):
    name: DnsName


class VolumeMount(_KubernetesObject):
    name: DnsName
    mount_path: Annotated[str, Field(min_length=1, max_length=1024)]


class LocalObjectReference(_Spec):
    name: DnsName


def _named_object_schema(description: str, required: list[str]) -> Any:
    return WithJsonSchema(
        {
            "type": "object",
            "description": description,
            "required": required,
            "properties": {r: {"type": "string", "minLength": 1, "maxLength": MAX_SHORT_STRING} for r in required},
            "x-kubernetes-preserve-unknown-fields": True,
        }
    )


class PodSecuritySpec(_Spec):
    """How locked down the trainer pods are (Pod Security Standards levels)."""

    level: Literal["restricted", "baseline"] = Field(
        default="restricted",
        description=(
            "restricted: run as runAsUser/runAsGroup (never root) with no privilege escalation, every capability "
            "dropped and the RuntimeDefault seccomp profile, as the Pod Security Standards' restricted level "
            "requires. baseline: set none of that, so the image's own USER applies (root included), for a custom "
            "image that needs root; the namespace must then admit the baseline level."
        ),
    )
    run_as_user: int = Field(
        default=TRAINER_UID,
        ge=1,
        le=MAX_UNIX_ID,
        description="uid the trainer runs as at the restricted level (the trainer image's USER).",
    )
    run_as_group: int = Field(
        default=TRAINER_GID,
        ge=0,
        le=MAX_UNIX_ID,
        description="gid the trainer runs as at the restricted level; also the pods' fsGroup at both levels.",
    )


class PodTemplateSpec(_Spec):
    """Additions to every trainer pod (they extend, never replace, what the operator sets)."""

    env: Annotated[list[EnvVar], Field(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="Extra environment variables for the trainer container (core/v1 EnvVar)."
    )
    volumes: Annotated[
        list[Annotated[Volume, _named_object_schema("A core/v1 Volume.", ["name"])]], Field(max_length=MAX_LIST_ITEMS)
    ] = Field(default_factory=list, description="Extra pod volumes (core/v1 Volume).")
    volume_mounts: Annotated[
        list[Annotated[VolumeMount, _named_object_schema("A core/v1 VolumeMount.", ["name", "mountPath"])]],
        Field(max_length=MAX_LIST_ITEMS),
    ] = Field(default_factory=list, description="Extra mounts in the trainer container (core/v1 VolumeMount).")
    labels: StringMap = Field(default_factory=dict, description="Extra pod labels.")
    annotations: StringMap = Field(default_factory=dict, description="Extra pod annotations.")
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="Pod imagePullSecrets."
    )
    pod_security: PodSecuritySpec = Field(
        default_factory=PodSecuritySpec,
        description="Security context of the trainer pods: restricted (the default) or baseline for root images.",
    )


# Every duration's maximum: a year. Without one, the CRD accepted values whose nanoseconds overflow
# the Job controller's int64 arithmetic (9223372037 s and up), which fails the Job at once.
MAX_DURATION_SECONDS = 365 * 24 * 3600
# A step of a large GRPO run (generation, scoring, an optimizer step) takes minutes; half an hour
# without one is a hang, not a slow step.
DEFAULT_PROGRESS_DEADLINE_SECONDS = 1800
# What a gang's first step is allowed on top of the progress deadline: downloading and loading the
# model, starting the vLLM engine (its CUDA graphs), the first generation.
FIRST_STEP_ALLOWANCE_SECONDS = 1800
# torch.distributed's (TrainingArguments.ddp_timeout) and DeepSpeed's default collective timeout.
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800


class RunPolicySpec(_Spec):
    """How the gang runs, restarts and ends."""

    def collective_timeout_seconds(self) -> int:
        """How long a collective (NCCL, gloo, DeepSpeed's) may wait before its rank exits: the
        progress deadline, but never less than torch's and DeepSpeed's own default (a gang's first
        collectives wait while rank 0 loads the model); that default with the deadline off."""
        return max(self.progress_deadline_seconds, DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)

    suspend: bool = Field(
        default=False,
        description="Suspend the job (pods are deleted; resume continues from the last checkpoint). Mutable.",
    )
    max_restarts: int = Field(
        default=3, ge=0, le=MAX_RESTARTS, description="Whole-gang restarts after a failure before the job is Failed."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        gt=0,
        le=MAX_DURATION_SECONDS,
        description="Fail the job after running this long (at most a year).",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Delete the job this long after it finished (at most a year). Mutable.",
    )
    stall_timeout_seconds: int | None = Field(
        default=None,
        gt=0,
        le=MAX_DURATION_SECONDS,
        description="Mark the job Stalled when the training step does not advance for this long (at most a year).",
    )
    progress_deadline_seconds: int = Field(
        default=DEFAULT_PROGRESS_DEADLINE_SECONDS,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="Restart the gang (counted against maxRestarts) when the training step of a running gang has "
        "not advanced for this long; a gang's first step is allowed this plus 1800 s to load the model and start "
        "the engine. The trainer's collectives time out after this too (at least 1800 s). 0 turns it off.",
    )


# Any JSON value (number, string, list, mapping): no type, so the API server keeps it as is.
TrainerArgValue = Annotated[
    Any,
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True, "description": "A TRL GRPOConfig argument value."}),
]


RUNTIME_KIND = "ColocGRPORuntime"
CLUSTER_RUNTIME_KIND = "ClusterColocGRPORuntime"
RuntimeKind = Literal["ColocGRPORuntime", "ClusterColocGRPORuntime"]


class RuntimeRef(_Spec):
    """The runtime a job takes its defaults from (api/runtime.py merges them)."""

    name: DnsName = Field(description="Name of the runtime.")
    kind: RuntimeKind | None = Field(
        default=None,
        description="ClusterColocGRPORuntime (cluster-wide; when left out) or ColocGRPORuntime (of the job's "
        "namespace).",
    )


class ColocGRPOJobSpec(_Spec):
    """Desired state of a GRPO training run."""

    runtime_ref: RuntimeRef | None = Field(
        default=None,
        description="A (Cluster)ColocGRPORuntime whose template gives this job's defaults; the job's own fields "
        "override them, except the runtime's lockedFields.",
    )

    image: ImageReference | None = Field(
        default=None,
        description="Trainer image, a reference such as registry.example.com/team/trainer:v1 or name@sha256:...; "
        "default: the operator's --trainer-image, else colocgrpo/trainer:<version>.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Trainer container imagePullPolicy."
    )
    command: (
        Annotated[list[Annotated[str, Field(max_length=MAX_LONG_STRING)]], Field(max_length=MAX_LIST_ITEMS)] | None
    ) = Field(
        default=None, description="Replaces the whole container command (the default launches accelerate or python)."
    )
    model: ModelSpec
    dataset: DatasetSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    vllm: VLLMSpec = Field(default_factory=VLLMSpec)
    deepspeed: DeepSpeedSpec = Field(default_factory=DeepSpeedSpec)
    rewards: Annotated[list[RewardSpec], Field(min_length=1, max_length=MAX_LIST_ITEMS)] = Field(
        description="Reward functions; the total reward is their weighted sum."
    )
    reward_modules: RewardModulesSpec | None = Field(default=None, description="User reward code from a ConfigMap.")
    trainer_args: Annotated[dict[str, TrainerArgValue], Field(max_length=MAX_MAP_ENTRIES)] = Field(
        default_factory=dict,
        description="TRL GRPOConfig arguments in TRL's own names (snake_case). Keys owned by typed fields are refused.",
    )
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    secrets: SecretsSpec = Field(default_factory=SecretsSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    pod_template: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)


# ----------------------------------------------------------------------------- status


class Phase(enum.StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"
    SUSPENDED = "Suspended"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(enum.StrEnum):
    SPEC_VALID = "SpecValid"
    QUEUED = "Queued"
    SUSPENDED = "Suspended"
    RUNNING = "Running"
    STALLED = "Stalled"
    PROGRESSING = "Progressing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PLAN_WARNING = "PlanWarning"


# metav1.Condition's reason: CamelCase, starting with a letter (Kubernetes' own validation of the field).
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_CONDITION_REASON = 1024
MAX_CONDITION_MESSAGE = 32768


class Condition(_Spec):
    """A condition shaped like metav1.Condition; `kubectl wait --for=condition=<type>` works on these."""

    type: ConditionType = Field(description="Condition type; the list holds at most one condition per type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, Field(min_length=1, max_length=MAX_CONDITION_REASON, pattern=CONDITION_REASON_PATTERN)] = (
        Field(description="CamelCase machine-readable reason for the condition's last transition.")
    )
    message: Annotated[str, Field(max_length=MAX_CONDITION_MESSAGE)] = Field(
        description="Human-readable details (may be empty)."
    )
    last_transition_time: Timestamp = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation that the condition was set from."
    )


class WorkersStatus(_Spec):
    """Pods of the gang, by state (written by the operator)."""

    active: int = Field(default=0, ge=0)
    ready: int = Field(default=0, ge=0)
    succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    gpus: int = Field(default=0, ge=0, description="GPUs held by the active pods.")


MAX_REWARD_HISTORY = 40


class ProgressStatus(_Spec):
    """Training progress, written only by the trainer (rank 0)."""

    step: int | None = Field(default=None, ge=0, description="Optimizer steps done.")
    max_steps: int | None = Field(default=None, ge=0, description="Optimizer steps of the whole run.")
    percent: int | None = Field(default=None, ge=0, le=100, description="step / maxSteps in percent, rounded down.")
    estimated_remaining_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Time left at the pace of the steps this trainer process has run (from lastUpdateTime).",
    )
    estimated_completion_time: Timestamp | None = Field(
        default=None, description="lastUpdateTime + estimatedRemainingSeconds: when training should end."
    )
    metrics: Annotated[dict[str, float], Field(max_length=MAX_MAP_ENTRIES)] = Field(
        default_factory=dict,
        description=(
            "Latest logged metrics: reward, kl, loss, completion_length, step_time_seconds, ...; with vLLM also "
            "the process's sleep_seconds_total, wake_seconds_total, push_seconds_total, generate_seconds_total."
        ),
    )
    reward_history: Annotated[list[float], Field(max_length=MAX_REWARD_HISTORY)] = Field(
        default_factory=list,
        description=f"The last {MAX_REWARD_HISTORY} logged rewards, oldest first (colocgrpo watch draws them).",
    )
    last_update_time: Timestamp | None = Field(default=None, description="When the trainer last reported.")
    last_checkpoint: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Path of the last checkpoint saved."
    )


class FailureStatus(_Spec):
    """The most recent gang failure, as the operator classified it (written by the operator)."""

    reason: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="CamelCase reason: OOMKilled, CUDAOutOfMemory, NCCLTimeout, Evicted, Error, ..."
    )
    message: Annotated[str, Field(max_length=32768)] | None = None
    counted: bool | None = Field(
        default=None, description="False for evictions and preemptions, which do not count against maxRestarts."
    )
    pod: Annotated[str, Field(max_length=MAX_SHORT_STRING)] | None = Field(
        default=None, description="The pod that failed first."
    )
    exit_code: int | None = None
    job_uid: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="uid of the batch Job that failed (each failure is counted once)."
    )
    time: Timestamp | None = None


class RuntimeStatus(_Spec):
    """The runtime the job's current gang was made from (written by the operator)."""

    kind: RuntimeKind | None = None
    name: Annotated[str, Field(max_length=MAX_SHORT_STRING)] | None = None
    generation: int | None = Field(default=None, ge=0, description="metadata.generation of the runtime used.")


class ColocGRPOJobStatus(_Spec):
    """Observed state. The operator owns everything except `progress`, which the trainer owns."""

    phase: Phase | None = None
    message: Annotated[str, Field(max_length=32768)] | None = Field(
        default=None, description="Human-readable summary of the phase."
    )
    conditions: Annotated[list[Condition], Field(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list,
        description="One condition per type (SpecValid, Queued, Suspended, Running, Stalled, Progressing, Succeeded, "
        "Failed, PlanWarning); the Running condition's reason says why the job is in its phase.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0)
    start_time: Timestamp | None = Field(
        default=None,
        description="When the gang first started; from then on the spec is immutable (except suspend and TTL).",
    )
    completion_time: Timestamp | None = None
    restarts: int = Field(default=0, ge=0, description="Whole-gang restarts so far.")
    disruptions: int | None = Field(
        default=None, ge=0, description="Gang restarts after evictions or preemptions (not counted in restarts)."
    )
    last_failure: FailureStatus | None = Field(default=None, description="The most recent gang failure.")
    workers: WorkersStatus | None = None
    rank0_pod: DnsName | None = Field(
        default=None, description="Name of the pod with completion index 0 (logs live there)."
    )
    progress: ProgressStatus | None = None
    runtime: RuntimeStatus | None = Field(
        default=None,
        description="The runtime (kind, name, generation) the current gang's spec was merged from; a runtime "
        "edited later reaches the job at its next gang restart.",
    )


# ----------------------------------------------------------------------------- the resource


class ObjectMeta(_KubernetesObject):
    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ColocGRPOJob(_Spec):
    """A GRPO training run: vLLM colocated in DeepSpeed ZeRO-3 training processes."""

    # apiVersion/kind are checked by parse_job (with a clear message) rather than by Literal types.
    api_version: str = Field(default="colocgrpo.io/v1alpha1")
    kind: str = Field(default="ColocGRPOJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ColocGRPOJobSpec
    status: ColocGRPOJobStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name or ""

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"

    @property
    def is_cpu_job(self) -> bool:
        return self.spec.resources.gpus_per_node == 0

    @property
    def world_size(self) -> int:
        """Training processes across the gang (one per GPU; one per pod for a CPU job)."""
        return self.spec.resources.nodes * max(self.spec.resources.gpus_per_node, 1)

    def to_dict(self) -> dict[str, Any]:
        """The object as Kubernetes shows it: camelCase, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
