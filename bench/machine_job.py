"""The job a GPU driver launches as: what the operator would run on this machine.

`examples/seed-qwen14b-tp4.yaml` re-shaped to one node of `gpus` GPUs with vLLM TP 1 (and,
optionally, trainer-state offload), so bench/grpo_step.py, bench/zero3_train_step.py's check
and tests/gpu/drivers/learning_run.py train under the files the operator renders for that shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "seed-qwen14b-tp4.yaml"


def machine_job(gpus: int = 1, offload_trainer_state: bool = False) -> Any:
    """The parsed ColocGRPOJob (imports the operator's API lazily: callers may fall back)."""
    import yaml

    from colocgrpo_operator.api import parse_job

    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["resources"] = {"nodes": 1, "gpusPerNode": gpus}
    obj["spec"]["vllm"]["tensorParallelSize"] = 1
    obj["spec"]["vllm"]["offloadTrainerState"] = offload_trainer_state
    return parse_job(obj)
