"""A job's cross-field rules, each written once: its fields, its predicate, its CEL form and its message.

Single fields are checked by their types (api/model.py for the spec, config.py for the trainer config). A rule
that spans fields is a `Rule` here, and every place that checks it reads it from this table:

- the CRD's `x-kubernetes-validations`, which the API server runs (api/crd.py generates them from `cel`);
- `colocgrpo validate` and the operator's SpecValid condition (api/validation.py evaluates `holds` on the spec);
- the trainer config's own check, for a config written by hand (config.py: every rule whose fields it carries);
- the trainer's TP groups (generation/tp_groups.py) and the memory planner, which credits nothing to a refused
  trainer-state offload (planner/inputs.py).

A rule's `message` names fields as `<arg>` (the field's path where it is read: `spec.vllm.tensorParallelSize` in
a job, `vllm.tensor_parallel_size` in a trainer config) and values as `{arg}`; the CRD's `messageExpression`
renders the same text, so the API server and `colocgrpo validate` say the same words.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

# TrainingArguments.optim values that mean AdamW: with vllm.offloadTrainerState the rendered deepspeed.json names
# DeepSpeed's own AdamW, which transformers then uses whatever `optim` says.
ADAMW_OPTIMS = frozenset({"adamw_torch", "adamw_torch_fused"})

_PATH = re.compile(r"<(\w+)>")
_VALUE = re.compile(r"\{(\w+)(![rs])?\}")


@dataclasses.dataclass(frozen=True)
class Field:
    """One input of a rule.

    Attributes:
        spec: its path under the job's `spec` (camelCase), or under one item of the rule's `scope`.
        config: its path in the trainer config (snake_case); None where the config does not carry it.
        default: its value where it is left out, the types' default; None: no value (CEL must test `{arg?}`).
    """

    spec: str
    config: str | None = None
    default: Any = None


@dataclasses.dataclass(frozen=True)
class Rule:
    """One cross-field rule.

    Attributes:
        name: what it is called in tests and docs.
        fields: the predicate's arguments, each a `Field`.
        holds: the predicate in Python, over the arguments' values (a field left out: its default).
        cel: the same predicate in CEL: `{arg}` is a value (its default where left out), `{arg?}` whether it is
            set. None where CEL cannot say it (a field in trainerArgs, whose values have no type in the CRD).
        message: what is wrong, after the reported field's path: `<arg>` a field's path, `{arg}` its value.
        reports: the argument whose field the message is about; None: the scope's item itself.
        reason: the API server's reason for a refusal.
        scope: "" for the spec; else the path of a list in the spec whose every item the rule checks.
    """

    name: str
    fields: Mapping[str, Field]
    holds: Callable[..., bool]
    cel: str | None
    message: str
    reports: str | None
    reason: str = "FieldValueInvalid"
    scope: str = ""

    @property
    def in_config(self) -> bool:
        """Whether the trainer config carries every field, so that its check runs this rule too."""
        return not self.scope and all(field.config is not None for field in self.fields.values())

    def text(self, values: Mapping[str, Any], path: Callable[[Field], str]) -> str:
        """The message, fields named by `path` and values from `values`."""
        named = _PATH.sub(lambda m: path(self.fields[m.group(1)]), self.message)
        return named.format(**{arg: values.get(arg) for arg in self.fields})

    def problem(self, values: Mapping[str, Any], path: Callable[[Field], str], where: str) -> tuple[str, str] | None:
        """(the reported field's path, the message) where the rule does not hold for `values`, else None.

        Args:
            values: each argument's value.
            path: a field's path in what is checked (`Field.spec` or `Field.config`, as its reader names it).
            where: the path of the scope's item (a scoped rule), else ignored.
        """
        if self.holds(**values):
            return None
        reported = path(self.fields[self.reports]) if self.reports is not None else where
        return reported, self.text(values, path)

    def value_of(self, source: Any) -> dict[str, Any]:
        """Each argument's value in a trainer config (or an object with its sections), by `Field.config`."""
        return {arg: lookup(source, field.config or "") for arg, field in self.fields.items()}


def lookup(source: Any, path: str) -> Any:
    """The value at a dotted path of attributes (typed sections) and keys (mappings); None where there is none."""
    value = source
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
        if value is None:
            return None
    return value


# ----------------------------------------------------------------------------------------------------- the table

_TP = Field("vllm.tensorParallelSize", "vllm.tensor_parallel_size", 1)
_GPUS = Field("resources.gpusPerNode", "resources.gpus_per_node", 1)
_NODES = Field("resources.nodes", "resources.nodes", 1)
_OFFLOAD = Field("vllm.offloadTrainerState", "vllm.offload_trainer_state", False)
_STAGE = Field("deepspeed.zeroStage", "deepspeed.zero_stage", 3)
_PARAMS = Field("deepspeed.offloadParams", "deepspeed.offload_params", "none")
_OPTIMIZER = Field("deepspeed.offloadOptimizer", "deepspeed.offload_optimizer", "none")
_POLICY = Field("vllm.sleepPolicy", "vllm.sleep_policy", "auto")

TP_IN_ONE_NODE = Rule(
    name="tensor-parallel group inside one node",
    fields={"tp": _TP, "gpus": _GPUS},
    holds=lambda tp, gpus: gpus == 0 or gpus % tp == 0,
    cel="{gpus} == 0 || {gpus} % {tp} == 0",
    message="must divide <gpus> ({gpus}): a tensor-parallel group lives inside one node, got {tp}",
    reports="tp",
)
TP_ONE_WITHOUT_GPUS = Rule(
    name="no tensor parallelism in a CPU job",
    fields={"tp": _TP, "gpus": _GPUS},
    holds=lambda tp, gpus: gpus > 0 or tp == 1,
    cel="{gpus} > 0 || {tp} == 1",
    message="must be 1 for a CPU job (<gpus> 0 runs no vLLM), got {tp}",
    reports="tp",
)
PARAM_OFFLOAD_NEEDS_ZERO3 = Rule(
    name="parameter offload needs ZeRO-3",
    fields={"params": _PARAMS, "stage": _STAGE},
    holds=lambda params, stage: params == "none" or stage == 3,
    cel="{params} == 'none' || {stage} == 3",
    message="needs <stage> 3 (only ZeRO-3 offloads parameters), got {stage}",
    reports="params",
)
OFFLOAD_NEEDS_ZERO3 = Rule(
    name="trainer-state offload needs ZeRO-3",
    fields={"offload": _OFFLOAD, "stage": _STAGE},
    holds=lambda offload, stage: not offload or stage == 3,
    cel="!{offload} || {stage} == 3",
    message="needs <stage> 3, got {stage}: the offload is built and checked for ZeRO-3 only (DeepSpeed 0.19's "
    "stage-0 optimizers cannot move their state at all)",
    reports="offload",
)
OFFLOAD_WITHOUT_PARAM_OFFLOAD = Rule(
    name="trainer-state offload without parameter offload",
    fields={"offload": _OFFLOAD, "params": _PARAMS},
    holds=lambda offload, params: not offload or params == "none",
    cel="!{offload} || {params} == 'none'",
    message="cannot be combined with <params> cpu: DeepSpeed refuses to move the states of offloaded parameters "
    "(they are on the CPU already)",
    reports="offload",
)
OFFLOAD_NEEDS_SLEEP = Rule(
    name="trainer-state offload needs a sleeping policy",
    fields={"offload": _OFFLOAD, "policy": _POLICY},
    holds=lambda offload, policy: not offload or policy != "off",
    cel="!{offload} || {policy} != 'off'",
    message="needs a sleeping <policy> (level1, level2 or auto): with off, vLLM never frees its memory, so the "
    "trainer state would never move",
    reports="offload",
)
OFFLOAD_NEEDS_ADAMW = Rule(
    name="trainer-state offload trains with DeepSpeed's AdamW",
    fields={"offload": _OFFLOAD, "optimizer": _OPTIMIZER, "optim": Field("trainerArgs.optim", "grpo.optim")},
    holds=lambda offload, optimizer, optim: (
        not offload or optimizer != "none" or optim is None or (isinstance(optim, str) and optim in ADAMW_OPTIMS)
    ),
    cel=None,
    message=f"must be unset or one of {', '.join(sorted(ADAMW_OPTIMS))} with <offload>: the trainer then uses "
    "DeepSpeed's own AdamW, so that its state can move; got {optim!r}",
    reports="optim",
)
MAX_MODEL_LEN_HOLDS_A_SEQUENCE = Rule(
    name="vLLM's context holds a prompt and its completion",
    fields={
        "length": Field("vllm.maxModelLen", "vllm.max_model_len"),
        "prompt": Field("dataset.maxPromptTokens", "dataset.max_prompt_tokens"),
        "completion": Field("trainerArgs.max_completion_length", "grpo.max_completion_length"),
    },
    holds=lambda length, prompt, completion: (
        length is None or prompt is None or not isinstance(completion, int) or prompt + completion <= length
    ),
    cel=None,
    message="must be at least <prompt> + <completion> ({prompt} + {completion}), got {length}",
    reports="length",
)
MULTI_NODE_RESUME_NEEDS_A_CLAIM = Rule(
    name="a gang across pods resumes from one volume",
    fields={
        "nodes": _NODES,
        "resume": Field("checkpoint.resume", "checkpoint.resume", "auto"),
        "claim": Field("checkpoint.claimName"),
    },
    holds=lambda nodes, resume, claim: nodes <= 1 or resume != "auto" or claim is not None,
    cel="{nodes} <= 1 || {claim?} || {resume} != 'auto'",
    message="is required when <nodes> is more than 1 and <resume> is auto: every rank must resume from the same "
    "checkpoint, and without a claim each pod saves into its own emptyDir (set a claim that every pod mounts, "
    "ReadWriteMany, or <resume>: never)",
    reports="claim",
    reason="FieldValueRequired",
)
# A toleration's rules, as the API server checks them on a pod.
_TOLERATIONS = "scheduling.tolerations"
TOLERATION_WITHOUT_KEY = Rule(
    name="a toleration without a key tolerates every taint",
    fields={"key": Field("key"), "operator": Field("operator")},
    holds=lambda key, operator: bool(key) or operator == "Exists",
    cel="({key?} && {key} != '') || ({operator?} && {operator} == 'Exists')",
    message="operator must be Exists when there is no key (which tolerates every taint)",
    reports=None,
    scope=_TOLERATIONS,
)
TOLERATION_EXISTS_WITHOUT_VALUE = Rule(
    name="operator Exists matches no value",
    fields={"operator": Field("operator"), "value": Field("value")},
    holds=lambda operator, value: operator != "Exists" or not value,
    cel="!{operator?} || {operator} != 'Exists' || !{value?} || {value} == ''",
    message="value must be empty when operator is Exists",
    reports=None,
    scope=_TOLERATIONS,
)
TOLERATION_SECONDS_FOR_NO_EXECUTE = Rule(
    name="tolerationSeconds only for NoExecute",
    fields={"seconds": Field("tolerationSeconds"), "effect": Field("effect")},
    holds=lambda seconds, effect: seconds is None or effect == "NoExecute",
    cel="!{seconds?} || ({effect?} && {effect} == 'NoExecute')",
    message="tolerationSeconds needs effect NoExecute",
    reports=None,
    scope=_TOLERATIONS,
)

RULES: tuple[Rule, ...] = (
    TP_IN_ONE_NODE,
    TP_ONE_WITHOUT_GPUS,
    PARAM_OFFLOAD_NEEDS_ZERO3,
    OFFLOAD_NEEDS_ZERO3,
    OFFLOAD_WITHOUT_PARAM_OFFLOAD,
    OFFLOAD_NEEDS_SLEEP,
    OFFLOAD_NEEDS_ADAMW,
    MAX_MODEL_LEN_HOLDS_A_SEQUENCE,
    MULTI_NODE_RESUME_NEEDS_A_CLAIM,
    TOLERATION_WITHOUT_KEY,
    TOLERATION_EXISTS_WITHOUT_VALUE,
    TOLERATION_SECONDS_FOR_NO_EXECUTE,
)
# What DeepSpeed 0.19's offload_states refuses: the planner credits nothing to an offload one of these refuses.
TRAINER_STATE_OFFLOAD_RULES = (OFFLOAD_NEEDS_ZERO3, OFFLOAD_WITHOUT_PARAM_OFFLOAD, OFFLOAD_NEEDS_SLEEP)


def spec_path(field: Field) -> str:
    """A field's path in a job (a rule on the spec)."""
    return f"spec.{field.spec}"


def config_path(field: Field) -> str:
    """A field's name in the trainer config."""
    return field.config or field.spec


def config_problems(config: Any) -> list[str]:
    """`path: message` for every rule the trainer config (or an object with its sections) breaks, of the rules
    whose fields it carries."""
    problems = []
    for rule in RULES:
        if rule.in_config and (found := rule.problem(rule.value_of(config), config_path, "")) is not None:
            problems.append(f"{found[0]}: {found[1]}")
    return problems
