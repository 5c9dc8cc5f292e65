"""ColocGRPOJob -> TrainerConfig (the `grpo.yaml` the trainer reads in every pod)."""

from __future__ import annotations

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import REWARD_MODULES_DIR
from colocgrpo_training.config import (
    CheckpointSettings,
    DatasetSettings,
    DeepSpeedSettings,
    JobRef,
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
        resources=ResourceSettings(
            nodes=spec.resources.nodes,
            gpus_per_node=spec.resources.gpus_per_node,
            gpu_memory_gib=spec.resources.gpu_memory_gib,
        ),
        deepspeed=DeepSpeedSettings(
            zero_stage=spec.deepspeed.zero_stage,
            offload_optimizer=spec.deepspeed.offload_optimizer,
            offload_params=spec.deepspeed.offload_params,
        ),
        vllm=VLLMSettings(
            # A CPU job has no GPU to colocate vLLM on; TRL then generates with transformers.
            enabled=not job.is_cpu_job,
            tensor_parallel_size=spec.vllm.tensor_parallel_size,
            gpu_memory_utilization=spec.vllm.gpu_memory_utilization,
            sleep_policy=spec.vllm.sleep_policy,
            max_model_len=spec.vllm.max_model_len,
            enable_prefix_caching=spec.vllm.enable_prefix_caching,
            max_num_seqs=spec.vllm.max_num_seqs,
            offload_trainer_state=spec.vllm.offload_trainer_state,
        ),
        training=TrainingSettings(micro_batch_merge=spec.training.micro_batch_merge),
        checkpoint=CheckpointSettings(
            dir=spec.checkpoint.path,
            save_steps=spec.checkpoint.save_steps,
            resume=spec.checkpoint.resume,
            save_final_model=spec.checkpoint.save_final_model,
            save_total_limit=spec.checkpoint.save_total_limit,
        ),
        grpo=_grpo_args(job),
    )


def _grpo_args(job: ColocGRPOJob) -> dict[str, object]:
    """The user's trainerArgs, with the process group's timeout (`ddp_timeout`: NCCL, gloo and
    DeepSpeed collectives) from the progress deadline unless they set it."""
    grpo = dict(job.spec.trainer_args)
    if job.spec.run_policy.progress_deadline_seconds:
        grpo.setdefault("ddp_timeout", job.spec.run_policy.collective_timeout_seconds())
    return grpo
