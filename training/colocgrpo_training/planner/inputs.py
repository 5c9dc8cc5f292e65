"""A `PlanRequest` resolved into the numbers the formulas take, with TRL 1.16's defaults filled in.

The request is typed (planner/request.py); only its `trainer_args`, TRL's own keyword arguments, are checked
here. The model's shape comes from its config.json, the built-in table or its parameter count (shapes.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from colocgrpo_training.config import SleepPolicy
from colocgrpo_training.planner.formulas import checkpointed_layers
from colocgrpo_training.planner.request import PlanRequest
from colocgrpo_training.planner.shapes import (
    KNOWN_FAMILIES,
    ModelShape,
    PlanInputError,
    approximate_shape,
    builtin_shape,
    parse_parameter_count,
    shape_from_config,
)
from colocgrpo_training.rules import PARAM_OFFLOAD_NEEDS_ZERO3, TRAINER_STATE_OFFLOAD_RULES, spec_path

# H200 ("141 GB" on the datasheet; nvidia-smi: 143771 MiB): torch's total_memory, which vLLM's
# gpu_memory_utilization multiplies, is 150,109,880,320 bytes = 139.8 GiB (measured, torch 2.11 / CUDA 13).
DEFAULT_GPU_MEMORY_GIB = 139.8

# TRL 1.16 / transformers defaults for the GRPOConfig arguments the plan depends on.
TRL_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,  # transformers TrainingArguments
    "gradient_accumulation_steps": 1,
    "max_completion_length": 512,  # GRPOConfig
    "gradient_checkpointing": True,  # GRPOConfig overrides transformers' False
    "beta": 0.0,  # GRPOConfig: no reference model unless beta > 0
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    model_name: str
    shape: ModelShape
    parameter_count: int
    dtype_bytes: int
    nodes: int
    gpus_per_node: int
    zero_stage: int
    offload_optimizer: bool
    offload_parameters: bool
    tensor_parallel_size: int
    gpu_memory_utilization: float
    sleep_policy: SleepPolicy
    max_model_len: int  # effective: the spec's, else the model's context window
    max_num_seqs: int | None
    offload_trainer_state: bool
    per_device_train_batch_size: int
    steps_per_generation: int
    prompt_tokens: int
    completion_tokens: int
    # Decoder layers under gradient checkpointing: every one (GRPOConfig's default), none
    # (`gradient_checkpointing: false`), ceil(layers / n) with transformers' `every_n_layers`, or the planner's count.
    checkpointed_layers: int
    beta: float
    gpu_memory_gib: float
    assumptions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # The layers kept whole are the last ones (the planner's pattern); False: interleaved (`every_n_layers`).
    whole_layers_last: bool = True

    @property
    def gradient_checkpointing(self) -> bool:
        return self.checkpointed_layers > 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def sequence_tokens(self) -> int:
        """Padded training sequence: prompt + completion, which vLLM cuts at max_model_len."""
        return min(self.prompt_tokens + self.completion_tokens, self.max_model_len)

    @property
    def generation_sequences(self) -> int:
        """Sequences one engine generates at once: TRL gathers the prompts of its TP group and sets
        max_num_seqs = per_device_train_batch_size x TP x steps_per_generation (grpo_trainer.py)."""
        batch = self.per_device_train_batch_size * self.tensor_parallel_size * self.steps_per_generation
        return min(batch, self.max_num_seqs) if self.max_num_seqs else batch


def _int(value: Any, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise PlanInputError(field, f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanInputError(field, f"must be a number, got {value!r}")
    return float(value)


def _every_n_layers(kwargs: Any) -> int:
    """transformers' `every_n_layers` from `gradient_checkpointing_kwargs` (a dict, or TrainingArguments' JSON
    string form); 1 where it is not set."""
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except ValueError:
            return 1
    if not isinstance(kwargs, dict) or kwargs.get("every_n_layers") is None:
        return 1
    return _int(kwargs["every_n_layers"], "spec.trainerArgs.gradient_checkpointing_kwargs.every_n_layers", 1)


def resolve_shape(name: str, parameter_count: Any, base_dir: Path | None) -> tuple[ModelShape, list[str]]:
    warnings: list[str] = []
    candidate = Path(name).expanduser()
    if not candidate.is_absolute() and base_dir is not None:
        candidate = base_dir / candidate
    shape: ModelShape | None
    if candidate.is_dir():
        config = candidate / "config.json"
        if not config.is_file():
            raise PlanInputError("spec.model.name", f"local directory {candidate} has no config.json")
        shape = shape_from_config(config)
    else:
        shape = builtin_shape(name)
    if shape is None:
        if parameter_count is None:
            raise PlanInputError(
                "spec.model.name",
                f"unknown model {name!r}: no local config.json at that path and not in the built-in table "
                f"({KNOWN_FAMILIES}); set spec.model.parameterCount to plan with an approximate shape",
            )
        shape = approximate_shape(parse_parameter_count(parameter_count))
        warnings.append(f"model shape is approximate ({shape.source}); activation and KV-cache terms may be off")
    elif parameter_count is not None:
        declared = parse_parameter_count(parameter_count)
        derived = shape.parameter_count()
        if abs(declared - derived) > 0.1 * derived:
            warnings.append(
                f"spec.model.parameterCount {declared / 1e9:.2f}B differs from the {derived / 1e9:.2f}B that "
                f"{shape.source} gives; planning with the latter"
            )
    return shape, warnings


def resolve_inputs(request: PlanRequest, *, base_dir: Path | None = None) -> PlanInputs:
    """The planner's numbers for `request`; raises PlanInputError naming the spec field at fault.

    Args:
        request: the job.
        base_dir: where a relative local model folder is looked up (the job file's folder); default the working
            directory.
    """
    trainer_args = request.trainer_args
    assumptions: list[str] = []
    warnings: list[str] = []

    shape, shape_warnings = resolve_shape(request.model, request.parameter_count, base_dir)
    warnings.extend(shape_warnings)

    dtype = request.dtype
    if dtype == "auto":
        assumptions.append("dtype auto planned as bfloat16")
    if dtype == "float32":
        warnings.append("float32 weights: model states follow DeepSpeed's mixed-precision formulas (underestimate)")

    nodes, gpus_per_node = request.resources.nodes, request.resources.gpus_per_node
    deepspeed = request.deepspeed
    zero_stage = deepspeed.zero_stage
    offload_optimizer = deepspeed.offload_optimizer != "none"
    offload_parameters = deepspeed.offload_params != "none"
    if offload_parameters and not PARAM_OFFLOAD_NEEDS_ZERO3.holds(**PARAM_OFFLOAD_NEEDS_ZERO3.value_of(request)):
        warnings.append(f"spec.deepspeed.offloadParams only exists in ZeRO-3; ignored at stage {zero_stage}")
        offload_parameters = False
    if offload_optimizer and zero_stage == 0:
        warnings.append("spec.deepspeed.offloadOptimizer needs ZeRO stage >= 1; ignored at stage 0")
        offload_optimizer = False
    if offload_parameters and not offload_optimizer:
        # DeepSpeed's estimator has no "params offloaded, optimizer on GPU" row; it does not exist in practice.
        warnings.append("spec.deepspeed.offloadParams without offloadOptimizer: planned as both offloaded")
        offload_optimizer = True

    vllm = request.vllm
    if "gpu_memory_utilization" not in vllm.model_fields_set:
        assumptions.append("gpuMemoryUtilization unset: vLLM gets the default 0.3")
    offload_trainer_state = vllm.offload_trainer_state
    for rule in TRAINER_STATE_OFFLOAD_RULES:
        # The API refuses such a job (rules.py); a plan of one credits nothing to the offload.
        refused = rule.problem(rule.value_of(request), spec_path, "spec")
        if refused is not None and offload_trainer_state:
            warnings.append(f"{' '.join(refused)}: the job is refused, planned as if nothing moved")
            offload_trainer_state = False

    def arg(key: str) -> Any:
        return trainer_args.get(key, TRL_DEFAULTS.get(key))

    batch = _int(arg("per_device_train_batch_size"), "spec.trainerArgs.per_device_train_batch_size", 1)
    accumulation = _int(arg("gradient_accumulation_steps"), "spec.trainerArgs.gradient_accumulation_steps", 1)
    steps_per_generation = trainer_args.get("steps_per_generation")
    if steps_per_generation is not None:
        steps_per_generation = _int(steps_per_generation, "spec.trainerArgs.steps_per_generation", 1)
    elif trainer_args.get("generation_batch_size") is not None and gpus_per_node > 0:
        generation_batch = _int(trainer_args["generation_batch_size"], "spec.trainerArgs.generation_batch_size", 1)
        steps_per_generation = max(1, generation_batch // (batch * nodes * gpus_per_node))
    else:
        steps_per_generation = accumulation  # GRPOConfig.__post_init__
    completion = _int(arg("max_completion_length"), "spec.trainerArgs.max_completion_length", 1)
    every_n_layers = _every_n_layers(trainer_args.get("gradient_checkpointing_kwargs"))
    checkpointed = checkpointed_layers(shape.num_layers, every_n_layers) if arg("gradient_checkpointing") else 0
    beta = _number(arg("beta"), "spec.trainerArgs.beta")

    if vllm.max_model_len is not None:
        max_model_len = vllm.max_model_len
    else:
        max_model_len = shape.max_position_embeddings or 0
    prompt = request.max_prompt_tokens
    if prompt is None and trainer_args.get("max_prompt_length") is not None:
        prompt = _int(trainer_args["max_prompt_length"], "spec.dataset.maxPromptTokens", 1)
    if prompt is None and vllm.max_model_len is not None:
        prompt = max(1, max_model_len - completion)
        assumptions.append(f"maxPromptTokens unset: prompts assumed up to maxModelLen - completion = {prompt} tokens")
    elif prompt is None:
        prompt = 512
        assumptions.append("maxPromptTokens unset: prompts assumed up to 512 tokens")
    if not max_model_len:
        max_model_len = prompt + completion
        assumptions.append(
            f"maxModelLen unset and unknown for this model: assumed prompt + completion = {max_model_len}"
        )
    elif vllm.max_model_len is None:
        assumptions.append(
            f"maxModelLen unset: vLLM uses the model's context window, {max_model_len} tokens, and must fit one "
            "such sequence in its KV cache; set spec.vllm.maxModelLen to prompt + completion to need less"
        )

    gib = request.resources.gpu_memory_gib
    return PlanInputs(
        model_name=request.model,
        shape=shape,
        parameter_count=shape.parameter_count(),
        dtype_bytes=DTYPE_BYTES[dtype],
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        zero_stage=zero_stage,
        offload_optimizer=offload_optimizer,
        offload_parameters=offload_parameters,
        tensor_parallel_size=vllm.tensor_parallel_size,
        gpu_memory_utilization=vllm.gpu_memory_utilization,
        sleep_policy=vllm.sleep_policy,
        max_model_len=max_model_len,
        max_num_seqs=vllm.max_num_seqs,
        offload_trainer_state=offload_trainer_state,
        per_device_train_batch_size=batch,
        steps_per_generation=steps_per_generation,
        prompt_tokens=prompt,
        completion_tokens=completion,
        checkpointed_layers=checkpointed,
        whole_layers_last=every_n_layers == 1,
        beta=beta,
        gpu_memory_gib=DEFAULT_GPU_MEMORY_GIB if gib is None else gib,
        assumptions=tuple(assumptions),
        warnings=tuple(warnings),
    )
