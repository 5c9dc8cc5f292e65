"""The GPU benchmark's 7.18B decoder (bench/grpo/model.py LARGE_SHAPES["7b"], SmolLM2's vocabulary, tied
embeddings) as a planner job: one H200, the operator's one-GPU ZeRO-3 file, the `large` size's batch (16 rows of
40 prompt + 64 completion tokens, 4 micro-batches per optimizer step, 8 per generation) and vLLM at 0.17, the
first utilization of the bench's ladder. The measurements the planner is checked against ran at this shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}
PARAMETERS = 7_180_914_688
BENCH_UTILIZATION = 0.17


def model_dir(root: Path) -> Path:
    path = root / "random-large"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def trainer_args(rows: int = 16, checkpointing: bool = True) -> dict[str, Any]:
    """The `large` size's settings with `rows` per micro-batch and the rows per step and generation kept."""
    return {
        "per_device_train_batch_size": rows,
        "gradient_accumulation_steps": 64 // rows,
        "steps_per_generation": 128 // rows,
        "max_completion_length": 64,
        "num_generations": 8,
        "gradient_checkpointing": checkpointing,
        "beta": 0.0,
    }


def spec(root: Path, rows: int = 16, checkpointing: bool = True) -> dict[str, Any]:
    return {
        "model": {"name": str(model_dir(root)), "dtype": "bfloat16"},
        "resources": {"nodes": 1, "gpusPerNode": 1},
        "deepspeed": {"zeroStage": 3},
        "vllm": {"gpuMemoryUtilization": BENCH_UTILIZATION, "sleepPolicy": "auto", "maxModelLen": 512},
        "dataset": {"maxPromptTokens": 40},
        "trainerArgs": trainer_args(rows, checkpointing),
    }
