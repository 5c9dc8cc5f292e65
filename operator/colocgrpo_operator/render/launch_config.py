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

# A ZeRO-3 parameter at or under this many elements is never released after use. DeepSpeed's
# int maximum: every parameter, whatever the model.
EVERY_PARAMETER = 2**63 - 1
# DeepSpeed's own default gradient bucket (elements). transformers' "auto" is hidden_size²
# (16.8M at hidden 4096): ~430 bucket flushes per backward of a 7B model.
DEEPSPEED_DEFAULT_BUCKET = 500_000_000


def one_gpu_resident(job: ColocGRPOJob) -> bool:
    """One training process with its parameters on the GPU, and kept there while vLLM generates.

    Then every ZeRO-3 "partition" is a whole parameter, so ZeRO-3 saves no memory and its
    machinery is pure overhead, most of it on the CPU (the profile at 7.18B: the GPU
    was busy ~1.0 s of a ~3 s train-only step). The knobs `one_gpu_zero3` sets remove what
    can be removed without leaving ZeRO-3 (the checkpoints, the weight push and
    `zeroStage` keep meaning what they mean for larger jobs).

    Not with `vllm.offloadTrainerState`: DeepSpeed's offload_states moves each parameter's
    partition but not a resident parameter's own view of it, so the GPU copy would stay
    alive (nothing offloaded) and reload_states would allocate a second one beside it.
    """
    return (
        job.world_size == 1 and job.spec.deepspeed.offload_params == "none" and not job.spec.vllm.offload_trainer_state
    )


def one_gpu_zero3() -> dict[str, Any]:
    return {
        # Keep every parameter resident: releasing saves nothing here, and each re-fetch
        # ends in a CUDA stream synchronize (DeepSpeed 0.19's no-gather handle), three
        # times per micro-batch (forward, checkpoint recompute, backward).
        "stage3_param_persistence_threshold": EVERY_PARAMETER,
        # DeepSpeed's replacement for F.linear (a Python autograd function, installed for
        # the whole process — vLLM's layers included) only avoids keeping weights alive for
        # the backward pass, and here they are alive anyway.
        "memory_efficient_linear": False,
        # Nothing is communicated with one process: a bucket is only a flush.
        "reduce_bucket_size": DEEPSPEED_DEFAULT_BUCKET,
    }


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


def deepspeed_config(job: ColocGRPOJob) -> dict[str, Any]:
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
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000,
                # Needed to save the final model as a Hugging Face checkpoint from ZeRO-3 shards.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if one_gpu_resident(job):
            zero.update(one_gpu_zero3())
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
