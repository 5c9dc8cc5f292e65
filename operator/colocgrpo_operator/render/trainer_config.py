"""ColocGRPOJob -> TrainerConfig (the `grpo.yaml` the trainer reads in every pod)."""

from __future__ import annotations

from typing import cast

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import REWARD_MODULES_DIR
from colocgrpo_training.config import (
    CheckpointSettings,
    DatasetSettings,
    DeepSpeedSettings,
    JobRef,
    MergePin,
    ModelSettings,
    ResourceSettings,
    RewardSettings,
    TrainerConfig,
    TrainingSettings,
    VLLMSettings,
)


def render_trainer_config(job: ColocGRPOJob) -> TrainerConfig:
    spec = job.spec
    return TrainerConfig(
        job=JobRef(name=job.name, namespace=job.namespace, uid=job.metadata.uid),
        model=ModelSettings(
            name_or_path=spec.model.name,
            revision=spec.model.revision,
            dtype=spec.model.dtype,
            attn_implementation=spec.model.attn_implementation,
        ),
        dataset=DatasetSettings(
            name_or_path=spec.dataset.name,
            config_name=spec.dataset.config,
            split=spec.dataset.split,
            prompt_column=spec.dataset.prompt_column,
            solution_column=spec.dataset.solution_column,
            system_prompt=spec.dataset.system_prompt,
            chat_template=spec.dataset.chat_template,
            max_prompt_tokens=spec.dataset.max_prompt_tokens,
        ),
        rewards=[RewardSettings(function=r.function, weight=r.weight) for r in spec.rewards],
        reward_modules_dir=REWARD_MODULES_DIR if spec.reward_modules else None,
        resources=resource_settings(job),
        deepspeed=deepspeed_settings(job),
        vllm=vllm_settings(job),
        training=TrainingSettings(micro_batch_merge=merge_pin(job)),
        checkpoint=CheckpointSettings(
            dir=spec.checkpoint.path,
            save_steps=spec.checkpoint.save_steps,
            resume=spec.checkpoint.resume,
            save_final_model=spec.checkpoint.save_final_model,
            save_total_limit=spec.checkpoint.save_total_limit,
        ),
        grpo=_grpo_args(job),
    )


def merge_pin(job: ColocGRPOJob) -> MergePin:
    """spec.training.microBatchMerge: auto, off or a factor (the model's validator admits nothing else)."""
    return cast(MergePin, job.spec.training.micro_batch_merge)


def resource_settings(job: ColocGRPOJob) -> ResourceSettings:
    """spec.resources as the trainer config carries it: the gang's shape and the memory per GPU."""
    resources = job.spec.resources
    return ResourceSettings(
        nodes=resources.nodes, gpus_per_node=resources.gpus_per_node, gpu_memory_gib=resources.gpu_memory_gib
    )


def deepspeed_settings(job: ColocGRPOJob) -> DeepSpeedSettings:
    """spec.deepspeed as the trainer config carries it: what render_deepspeed_json writes."""
    deepspeed = job.spec.deepspeed
    return DeepSpeedSettings(
        zero_stage=deepspeed.zero_stage,
        offload_optimizer=deepspeed.offload_optimizer,
        offload_params=deepspeed.offload_params,
    )


def vllm_settings(job: ColocGRPOJob) -> VLLMSettings:
    """spec.vllm as the trainer config carries it: the one writer of every vLLM setting the trainer passes on."""
    vllm = job.spec.vllm
    return VLLMSettings(
        # A CPU job has no GPU to colocate vLLM on; TRL then generates with transformers.
        enabled=not job.is_cpu_job,
        tensor_parallel_size=vllm.tensor_parallel_size,
        gpu_memory_utilization=vllm.gpu_memory_utilization,
        sleep_policy=vllm.sleep_policy,
        max_model_len=vllm.max_model_len,
        enable_prefix_caching=vllm.enable_prefix_caching,
        max_num_seqs=vllm.max_num_seqs,
        offload_trainer_state=vllm.offload_trainer_state,
    )


def _grpo_args(job: ColocGRPOJob) -> dict[str, object]:
    """The user's trainerArgs, with the process group's timeout (`ddp_timeout`: NCCL, gloo and
    DeepSpeed collectives) from the progress deadline unless they set it."""
    grpo = dict(job.spec.trainer_args)
    if job.spec.run_policy.progress_deadline_seconds:
        grpo.setdefault("ddp_timeout", job.spec.run_policy.collective_timeout_seconds())
    return grpo
