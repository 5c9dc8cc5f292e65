"""A ColocGRPOTrainer for TRL's real loop on CPU: the tiny model, the vLLM stand-in (install it first:
`support.cpu_vllm.install`), arithmetic prompts and a length reward that varies across completions.

The CPU tests of the trainer differ in the schedule and the trainer's own options only; the rest of the
GRPOConfig (CPU, float32, no reports or checkpoints, a log line per step) is the same for all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    """Varies across completions, so advantages (hence gradients) are non-zero."""
    return [float(len(str(c))) / 10.0 for c in completions]


def cpu_trainer(
    model_dir: Path,
    out_dir: Path,
    *,
    prompts: int,
    policy: str = "level2",
    trainer_options: dict[str, Any] | None = None,
    **grpo: Any,
) -> Any:
    """A ColocGRPOTrainer over `prompts` rows, sleep policy `policy`; `grpo` sets or overrides GRPOConfig
    fields (the schedule, the learning rate, the seed), `trainer_options` ColocGRPOTrainer's own."""
    from datasets import Dataset
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer
    from colocgrpo_training.grpo_args import vllm_args

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}]} for i in range(prompts)]
    settings = VLLMSettings(sleep_policy=policy)
    config = {
        **vllm_args(settings),
        "output_dir": str(out_dir),
        "report_to": [],
        "use_cpu": True,
        "bf16": False,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        **grpo,
    }
    return ColocGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[length_reward],
        args=GRPOConfig(**config),
        train_dataset=Dataset.from_list(rows),
        generation_settings=settings,
        **(trainer_options or {}),
    )
