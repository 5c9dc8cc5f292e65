"""Checks on `spec.trainerArgs`: TRL GRPOConfig arguments passed through by name.

The accepted names are the fields of the pinned TRL's GRPOConfig (which inherits
transformers' TrainingArguments), committed in grpo_config_fields.txt so the operator
never needs TRL installed. tests/training keeps that file equal to
`dataclasses.fields(GRPOConfig)` in the trainer venv.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from importlib import resources
from typing import Any

# GRPOConfig arguments that a typed field of the spec owns: setting them in trainerArgs
# would either be overwritten or silently disagree with what the operator renders.
OWNED_KEYS: dict[str, str] = {
    "use_vllm": "spec.resources.gpusPerNode (vLLM is always on for GPU jobs, off for CPU jobs)",
    "vllm_mode": "spec.vllm (vLLM always runs colocated)",
    "vllm_tensor_parallel_size": "spec.vllm.tensorParallelSize",
    "vllm_gpu_memory_utilization": "spec.vllm.gpuMemoryUtilization",
    "vllm_max_model_length": "spec.vllm.maxModelLen",
    "vllm_enable_sleep_mode": "spec.vllm.sleepPolicy",
    "vllm_server_base_url": "spec.vllm (server mode is not supported: vLLM always runs colocated)",
    "vllm_server_host": "spec.vllm (server mode is not supported: vLLM always runs colocated)",
    "vllm_server_port": "spec.vllm (server mode is not supported: vLLM always runs colocated)",
    "vllm_server_timeout": "spec.vllm (server mode is not supported: vLLM always runs colocated)",
    "vllm_group_port": "spec.vllm (server mode is not supported: vLLM always runs colocated)",
    "output_dir": "spec.checkpoint.path",
    "save_strategy": "spec.checkpoint.saveSteps",
    "save_steps": "spec.checkpoint.saveSteps",
    "save_total_limit": "spec.checkpoint.saveTotalLimit",
    "resume_from_checkpoint": "spec.checkpoint.resume",
    "deepspeed": "spec.deepspeed",
    "fsdp": "spec.deepspeed (this operator trains with DeepSpeed)",
    "fsdp_config": "spec.deepspeed (this operator trains with DeepSpeed)",
    "use_cpu": "spec.resources.gpusPerNode (0 makes a CPU job)",
    "local_rank": "spec.resources (the launcher assigns ranks)",
    "hub_token": "spec.secrets.huggingFaceToken (a token never goes into a ConfigMap)",
    "reward_weights": "spec.rewards[].weight",
    # Mixed precision follows the model dtype (bfloat16 -> bf16, float16 -> fp16).
    "bf16": "spec.model.dtype",
    "fp16": "spec.model.dtype",
}

# model_init_kwargs is allowed, but not these keys inside it.
OWNED_MODEL_INIT_KWARGS: dict[str, str] = {
    "dtype": "spec.model.dtype",
    "torch_dtype": "spec.model.dtype",
    "attn_implementation": "spec.model.attnImplementation",
    "revision": "spec.model.revision",
}

# Names from older TRL/transformers/open-r1 recipes that are not GRPOConfig fields in the
# pinned versions, with where their meaning lives now.
RENAMED_KEYS: dict[str, str] = {
    "warmup_ratio": "transformers 5 removed it; use warmup_steps with a float in [0, 1) (a ratio of total steps)",
    "max_prompt_length": "TRL 1.16 removed it; use spec.dataset.maxPromptTokens",
    "overwrite_output_dir": "transformers 5 removed it; the checkpoint directory is spec.checkpoint.path",
    "vllm_max_model_len": "use spec.vllm.maxModelLen",
    "vllm_tp": "use spec.vllm.tensorParallelSize",
    "vllm_enable_prefix_caching": "use spec.vllm.enablePrefixCaching",
    "vllm_max_num_seqs": "use spec.vllm.maxNumSeqs",
    "torch_dtype": "use spec.model.dtype",
    "model_name_or_path": "use spec.model.name",
    "reward_funcs": "use spec.rewards",
}

# The trainerArgs.report_to integrations the trainer image installs (images/trainer/requirements.txt; tests/images
# checks transformers finds each of them there): a job may name these ("none" reports nowhere), alone or in a list.
REPORT_TO: tuple[str, ...] = ("none", "tensorboard", "wandb", "mlflow")

REFUSED_KEYS: dict[str, str] = {
    "use_peft": (
        "PEFT/LoRA is not supported end to end (weight sync into vLLM pushes full weights); train the full model"
    ),
}


@lru_cache(maxsize=1)
def grpo_config_fields() -> frozenset[str]:
    """Field names of the pinned TRL GRPOConfig (including TrainingArguments)."""
    text = resources.files("colocgrpo_operator.api").joinpath("grpo_config_fields.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def trainer_args_problems(trainer_args: dict[str, Any], path: str = "spec.trainerArgs") -> list[tuple[str, str]]:
    """(field path, message) for every key of trainerArgs that cannot be passed to GRPOConfig."""
    problems: list[tuple[str, str]] = []
    known = grpo_config_fields()
    for key, value in trainer_args.items():
        key_path = f"{path}.{key}"
        if key in REFUSED_KEYS:
            problems.append((key_path, f"refused: {REFUSED_KEYS[key]}"))
        elif key in OWNED_KEYS:
            problems.append((key_path, f"set by a typed field instead: {OWNED_KEYS[key]}"))
        elif key in RENAMED_KEYS:
            problems.append((key_path, f"not a TRL 1.16 GRPOConfig argument: {RENAMED_KEYS[key]}"))
        elif key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append((key_path, f"unknown TRL 1.16 GRPOConfig argument{hint}"))
        elif key == "report_to":
            problems.extend(report_to_problems(value, key_path))
        elif key == "model_init_kwargs" and isinstance(value, dict):
            for inner in value:
                if inner in OWNED_MODEL_INIT_KWARGS:
                    problems.append(
                        (f"{key_path}.{inner}", f"set by a typed field instead: {OWNED_MODEL_INIT_KWARGS[inner]}")
                    )
    return problems


def report_to_problems(value: Any, path: str = "spec.trainerArgs.report_to") -> list[tuple[str, str]]:
    """(field path, message) for each integration `report_to` names that the trainer image does not install.

    Args:
        value: trainerArgs.report_to: one name or a list of names (TRL also accepts "all", every integration that
            happens to be installed; a job names them instead, so what it reports to does not depend on the image).
        path: the field path the messages name.

    Returns:
        Nothing when every name is one of REPORT_TO.
    """
    names = value if isinstance(value, list) else [value]
    unknown = [name for name in names if name not in REPORT_TO]
    if not unknown:
        return []
    shown = ", ".join(repr(name) for name in unknown)
    return [
        (
            path,
            f"{shown}: the trainer image reports only to {', '.join(REPORT_TO)} (one of them or a list of them)",
        )
    ]
