"""accelerate.yaml and deepspeed.json for a job's ConfigMap.

The DeepSpeed file leaves batch sizes, accumulation, clipping and precision as "auto"
so transformers fills them from GRPOConfig: one source for each number, no drift
between the two files. accelerate is told only the topology.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import CONFIG_MOUNT_DIR, DEEPSPEED_CONFIG_KEY, RENDEZVOUS_PORT, rank0_address
from colocgrpo_training.config import YAML_DUMPER
from colocgrpo_training.planner.inputs import resolve_shape
from colocgrpo_training.planner.shapes import ModelShape, PlanInputError
from colocgrpo_training.planner.zero3 import Zero3Knobs, zero3_knobs


def zero3_knobs_of(job: ColocGRPOJob, shape: ModelShape | None = None) -> Zero3Knobs:
    """The planner's ZeRO-3 knobs for `job` (`colocgrpo_training.planner.zero3`), what `colocgrpo plan` shows.

    The model's shape is `shape` when given, else the built-in table's, a config.json's at `spec.model.name` when that
    is a folder here, or `spec.model.parameterCount`'s; without any, the shape-sized knobs are transformers' `auto`."""
    if shape is None:
        try:
            shape = resolve_shape(job.spec.model.name, job.spec.model.parameter_count, None)[0]
        except PlanInputError:
            shape = None
    return zero3_knobs(
        shape,
        world_size=job.world_size,
        offload_parameters=job.spec.deepspeed.offload_params != "none",
        offload_trainer_state=job.spec.vllm.offload_trainer_state,
    )


# DeepSpeed's own AdamW, its hyperparameters filled by transformers from GRPOConfig (learning_rate,
# adam_beta1/2, adam_epsilon, weight_decay). With the optimizer on the GPU DeepSpeed builds its FusedAdam,
# the one optimizer whose moments and fp32 master weights DeepSpeed 0.19's offload_states can move.
DEEPSPEED_ADAMW: dict[str, Any] = {
    "type": "AdamW",
    "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
}


def deepspeed_optimizer(job: ColocGRPOJob) -> dict[str, Any] | None:
    """The `optimizer` block, only where the trainer-state offload needs it: with
    `vllm.offloadTrainerState` and the optimizer on the GPU. Elsewhere transformers builds the
    optimizer `trainerArgs.optim` names (torch AdamW by default; accelerate swaps it for DeepSpeed's
    CPU Adam under `offloadOptimizer: cpu`). docs/decisions.md, "Trainer-state offload"."""
    if job.spec.vllm.offload_trainer_state and job.spec.deepspeed.offload_optimizer == "none":
        return {"type": DEEPSPEED_ADAMW["type"], "params": dict(DEEPSPEED_ADAMW["params"])}
    return None


def deepspeed_config(job: ColocGRPOJob, *, shape: ModelShape | None = None) -> dict[str, Any]:
    """The job's deepspeed.json as a dict.

    Args:
        job: a validated job.
        shape: the model's shape, for a caller that knows it better than the job's model name tells (a benchmark's
            model built on the machine); the ZeRO-3 knobs are sized from it (`zero3_knobs_of`).
    """
    deepspeed = job.spec.deepspeed
    zero: dict[str, Any] = {
        "stage": deepspeed.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "offload_optimizer": {"device": deepspeed.offload_optimizer, "pin_memory": True},
    }
    if deepspeed.zero_stage == 3:
        zero.update(
            {
                "offload_param": {"device": deepspeed.offload_params, "pin_memory": True},
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000,
                # Needed to save the final model as a Hugging Face checkpoint from ZeRO-3 shards.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        zero.update(zero3_knobs_of(job, shape).section())
    config: dict[str, Any] = {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "steps_per_print": 1_000_000,  # TRL logs; DeepSpeed's own step prints are noise
        "wall_clock_breakdown": False,
    }
    optimizer = deepspeed_optimizer(job)
    if optimizer is not None:
        config["optimizer"] = optimizer
    return config


def render_deepspeed_json(job: ColocGRPOJob) -> str:
    return json.dumps(deepspeed_config(job), indent=2) + "\n"


def accelerate_config(job: ColocGRPOJob) -> dict[str, Any]:
    resources = job.spec.resources
    common: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "main_training_function": "main",
        "num_machines": resources.nodes,
        "num_processes": job.world_size,
        # Overridden per pod on the command line from the completion index.
        "machine_rank": 0,
        "main_process_ip": rank0_address(job.name),
        "main_process_port": RENDEZVOUS_PORT,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if job.is_cpu_job:
        return {**common, "distributed_type": "MULTI_CPU" if resources.nodes > 1 else "NO", "use_cpu": True}
    return {
        **common,
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {
            "deepspeed_config_file": f"{CONFIG_MOUNT_DIR}/{DEEPSPEED_CONFIG_KEY}",
            "deepspeed_multinode_launcher": "standard",
        },
        "use_cpu": False,
    }


def render_accelerate_yaml(job: ColocGRPOJob) -> str:
    return yaml.dump(accelerate_config(job), Dumper=YAML_DUMPER, sort_keys=False)
