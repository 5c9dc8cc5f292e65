"""The trainer-config contract: the `grpo.yaml` key of a job's ConfigMap.

This file is the only interface between the operator (which renders it from a
ColocGRPOJob) and the trainer (which reads it inside every pod). It imports no torch
so the operator can use it. Bump `CONFIG_VERSION` on any incompatible change; the
trainer refuses versions it does not know instead of guessing.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from colocgrpo_training.rules import config_problems

# libyaml's emitter where PyYAML has it (the same text, ~10x faster): the operator renders this
# config for every new job, and in a 500-job burst the pure-Python emitter was most of that work.
YAML_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# 2: the gang's shape, DeepSpeed's settings and the micro-batch merge travel here, not in the environment.
CONFIG_VERSION = 2


class _Strict(BaseModel):
    # Unknown keys are an error: a renamed field must fail loudly, not vanish.
    model_config = ConfigDict(extra="forbid")


class SleepPolicy(enum.StrEnum):
    """What vLLM does with its GPU memory between generations (see docs/sleep-policy.md)."""

    OFF = "off"  # stays resident
    LEVEL1 = "level1"  # weights offloaded to pinned CPU memory; wake restores them
    LEVEL2 = "level2"  # weights discarded; every wake before a generate re-pushes all weights
    AUTO = "auto"  # per generation: the cheaper correct choice, by measured cost


class JobRef(_Strict):
    name: str
    namespace: str
    # metadata.uid of the job the operator rendered this config for: the trainer's progress writes
    # are bound to that incarnation (a job deleted and created again under the same name is another).
    uid: str | None = None

    def progress_patch(self, progress: dict[str, Any]) -> tuple[Any, str]:
        """The status-subresource patch that sets `status.progress`, and its content type. With a
        uid, a JSON patch whose first operation tests /metadata/uid, so the API server refuses it
        (422) once the job is another incarnation: a deleted job's trainer, alive through its grace
        period, writes nothing on a successor of the same name. It needs the status to exist (the
        operator writes it before the gang's pods start). Without a uid, a merge patch."""
        if self.uid is None:
            return {"status": {"progress": progress}}, "application/merge-patch+json"
        operations = [
            {"op": "test", "path": "/metadata/uid", "value": self.uid},
            {"op": "add", "path": "/status/progress", "value": progress},
        ]
        return operations, "application/json-patch+json"


Dtype = Literal["bfloat16", "float16", "float32", "auto"]


class ModelSettings(_Strict):
    name_or_path: str
    revision: str | None = None
    dtype: Dtype = "bfloat16"
    attn_implementation: str | None = None


class DatasetSettings(_Strict):
    name_or_path: str
    config_name: str | None = None
    split: str = "train"
    prompt_column: str = "problem"
    # Gold answers for the accuracy reward; absent columns simply disable that reward's input.
    solution_column: str = "solution"
    system_prompt: str | None = None
    chat_template: str | None = None
    # Our own prompt truncation (TRL 1.16 dropped GRPOConfig.max_prompt_length), in tokens.
    max_prompt_tokens: int | None = Field(default=None, gt=0)


class RewardSettings(_Strict):
    # A built-in name (accuracy, format, tag_count, ...) or "module:function".
    function: str
    weight: float = 1.0


class VLLMSettings(_Strict):
    enabled: bool = True
    tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.3, gt=0, lt=1)
    sleep_policy: SleepPolicy = SleepPolicy.AUTO
    max_model_len: int | None = Field(default=None, gt=0)
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = Field(default=None, gt=0)
    # Move the ZeRO-3 trainer state to pinned CPU memory while vLLM generates (docs/sleep-policy.md).
    offload_trainer_state: bool = False


class ResourceSettings(_Strict):
    """spec.resources: the gang's shape, and the memory per GPU the micro-batch merge plans for."""

    nodes: int = Field(default=1, ge=1)
    # Processes per pod, one per GPU; 0: a CPU job, one process per pod.
    gpus_per_node: int = Field(default=1, ge=0)
    # None: the memory of this process's GPU, as torch's total_memory counts it.
    gpu_memory_gib: float | None = Field(default=None, gt=0)

    @property
    def world_size(self) -> int:
        """Training processes across the gang."""
        return self.nodes * max(self.gpus_per_node, 1)


class DeepSpeedSettings(_Strict):
    """spec.deepspeed: the ZeRO stage and offloads of the deepspeed.json the operator renders (CPU jobs run
    without DeepSpeed)."""

    zero_stage: int = Field(default=3, ge=0, le=3)
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_params: Literal["none", "cpu"] = "none"


# The micro-batch merge (planner/micro_batches.py): auto, off, or a factor to use as given.
MergePin = Literal["auto", "off"] | Annotated[int, Field(ge=1)]


class TrainingSettings(_Strict):
    """spec.training: colocgrpo's own training options, beside TRL's (`grpo`)."""

    micro_batch_merge: MergePin = "auto"


class CheckpointSettings(_Strict):
    dir: str
    save_steps: int | None = Field(default=None, gt=0)
    resume: Literal["auto", "never"] = "auto"
    save_final_model: bool = True
    save_total_limit: int | None = Field(default=2, gt=0)


class ProgressSettings(_Strict):
    # Rank 0 patches status.progress of the job at most this often.
    min_interval_seconds: float = Field(default=5.0, ge=0)
    patch_status: bool = True


class TrainerConfig(_Strict):
    version: int = CONFIG_VERSION
    job: JobRef
    model: ModelSettings
    dataset: DatasetSettings
    rewards: list[RewardSettings] = Field(min_length=1)
    # Where the user's reward ConfigMap is mounted; put on sys.path before resolving rewards.
    reward_modules_dir: str | None = None
    resources: ResourceSettings = ResourceSettings()
    deepspeed: DeepSpeedSettings = DeepSpeedSettings()
    vllm: VLLMSettings
    training: TrainingSettings = TrainingSettings()
    checkpoint: CheckpointSettings
    progress: ProgressSettings = ProgressSettings()
    # TRL GRPOConfig keyword arguments, in TRL's own names, passed through as-is.
    grpo: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TrainerConfig:
        """The job's cross-field rules (rules.py) whose fields this config carries: a config written by hand gets
        the checks the operator runs on the spec."""
        problems = config_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_yaml(self) -> str:
        return yaml.dump(self.model_dump(mode="json"), Dumper=YAML_DUMPER, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> TrainerConfig:
        data = yaml.safe_load(text) or {}
        version = data.get("version") if isinstance(data, dict) else None
        if version != CONFIG_VERSION:
            raise ValueError(
                f"trainer config version {version!r} is not supported by this trainer "
                f"(expects {CONFIG_VERSION}); the operator and trainer image are out of step"
            )
        return cls.model_validate(data)

    @classmethod
    def load(cls, path: str | Path) -> TrainerConfig:
        return cls.from_yaml(Path(path).read_text())
