"""The job a GPU driver launches as: what the operator would run on this machine.

`examples/seed-qwen14b-tp4.yaml` re-shaped to one node of `gpus` GPUs with vLLM TP
`tensor_parallel_size` (1 unless asked; and, optionally, trainer-state offload), so
bench/grpo/, bench/zero3_train_step.py's check and tests/gpu/drivers/learning_run.py
train under the files the operator renders for that shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colocgrpo_training.planner.shapes import ModelShape

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "seed-qwen14b-tp4.yaml"


def machine_job(gpus: int = 1, offload_trainer_state: bool = False, tensor_parallel_size: int = 1) -> Any:
    """The parsed ColocGRPOJob (imports the operator's API lazily: callers may fall back). A TP
    size that does not divide `gpus` is refused by the operator's validation, naming the field."""
    import yaml

    from colocgrpo_operator.api import parse_job

    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["resources"] = {"nodes": 1, "gpusPerNode": gpus}
    obj["spec"]["vllm"]["tensorParallelSize"] = tensor_parallel_size
    obj["spec"]["vllm"]["offloadTrainerState"] = offload_trainer_state
    return parse_job(obj)


def folder_shape(model_dir: str | Path | None) -> ModelShape | None:
    """The planner's shape of the model in `model_dir`, from its config.json; None where there is
    none, and the operator's render then sizes the ZeRO-3 knobs for the example job's model."""
    from colocgrpo_training.planner.shapes import shape_from_config

    config = Path(model_dir) / "config.json" if model_dir else None
    return shape_from_config(config) if config is not None and config.is_file() else None


def completed_deepspeed_config(
    model: Any,
    *,
    gpus: int = 8,
    offload_trainer_state: bool = False,
    accumulation: int = 1,
    micro_batch: int = 1,
    steps: int = 1,
    learning_rate: float = 1e-4,
    bf16: bool = True,
) -> dict[str, Any]:
    """deepspeed.json as the operator renders it for `machine_job(gpus, offload_trainer_state)` training `model`
    (its ZeRO-3 knobs sized for `model`'s shape),
    completed the way transformers completes it for a run (`HfTrainerDeepSpeedConfig`: the "auto"
    values from TrainingArguments and the model), for drivers that build a DeepSpeed engine
    themselves. With `gpus` > 1 a one-process run takes the code paths a multi-GPU job takes
    (every large parameter released after use)."""
    import copy
    import tempfile

    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    from colocgrpo_operator.render import deepspeed_config
    from colocgrpo_training.planner.shapes import shape_from_mapping

    shape = shape_from_mapping(model.config.to_dict(), f"{type(model).__name__}'s config")
    rendered = deepspeed_config(machine_job(gpus=gpus, offload_trainer_state=offload_trainer_state), shape=shape)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="colocgrpo-deepspeed-"),
        bf16=bf16,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        learning_rate=learning_rate,
        max_grad_norm=1.0,
        report_to="none",
    )
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(rendered))
    hf.trainer_config_process(args)
    hf.trainer_config_finalize(args, model, num_training_steps=steps)
    unset_hf_deepspeed_config()  # a ZeRO-3 config left registered would make from_pretrained partition
    return hf.config
