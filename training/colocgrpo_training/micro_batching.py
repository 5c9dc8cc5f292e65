"""This training process's facts → the memory planner's inputs → the micro-batch merge (planner/micro_batches.py).

`merge_micro_batches` is what a real job (`grpo_args.build_grpo_config`) and the GPU benchmark's own contenders
(bench/grpo/) call on their GRPOConfig keyword arguments before building the GRPOConfig. The facts it
reads, none of them in the trainer config:

- the processes: `WORLD_SIZE` and `LOCAL_WORLD_SIZE` (set by `accelerate launch` / torchrun; 1 otherwise);
- the GPU's memory: torch's `total_memory` of this process's device (`LOCAL_RANK`), the number vLLM's
  utilization multiplies; no CUDA device, no plan;
- ZeRO: the DeepSpeed file accelerate hands the process (`ACCELERATE_DEEPSPEED_CONFIG_FILE`, the operator's
  deepspeed.json): stage and offloads; without DeepSpeed, stage 0;
- the model's shape: its config.json (a local folder, else the Hugging Face cache or Hub, where the trainer loads
  the model from anyway), else the planner's built-in table by name.

The pin, `training.micro_batch_merge` of the trainer config (`spec.training.microBatchMerge`): `auto` (default), `off`,
or a factor to use as given (it must divide gradient_accumulation_steps and steps_per_generation, and the merge must
be exact).
`COLOCGRPO_GPU_MEMORY_GIB` plans for that much GPU memory instead of the device's (a shared GPU, a MIG slice).

Each rank plans alone, before the process group exists; `agree_merge` then makes the factor every rank's smallest
(the number of forwards and backwards, collectives under ZeRO-3, must be equal on every rank).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from colocgrpo_training.agreement import gather
from colocgrpo_training.config import MergePin, VLLMSettings
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.planner.inputs import PlanInputs, read_inputs
from colocgrpo_training.planner.micro_batches import PIN_FIELD, MicroBatchMerge, plan_micro_batches
from colocgrpo_training.planner.shapes import PlanInputError

log = logging.getLogger("colocgrpo.micro_batches")

GPU_MEMORY_ENV = "COLOCGRPO_GPU_MEMORY_GIB"
GIB = 1024**3


def gpu_memory_gib(environ: Mapping[str, str]) -> float | None:
    """This process's GPU memory in GiB: `COLOCGRPO_GPU_MEMORY_GIB` where set (a GPU shared with other work, a MIG
    slice), else torch's total_memory of its device; None without CUDA."""
    given = environ.get(GPU_MEMORY_ENV, "").strip()
    if given:
        try:
            value = float(given)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise InvalidConfigError(f"{GPU_MEMORY_ENV}={given!r}: expected the GPU's memory in GiB, a number > 0")
        return value
    import torch

    if not torch.cuda.is_available():
        return None
    device = int(environ.get("LOCAL_RANK", "0") or 0)
    return torch.cuda.get_device_properties(device).total_memory / GIB


def deepspeed_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The planner's `spec.deepspeed` from the DeepSpeed file accelerate passes; stage 0 without DeepSpeed.
    Raises PlanInputError when the file cannot be read or leaves the stage to "auto"."""
    if environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return {"zeroStage": 0}
    path = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path:
        raise PlanInputError("deepspeed", "DeepSpeed is on but accelerate named no DeepSpeed file")
    try:
        zero = json.loads(Path(path).read_text()).get("zero_optimization") or {}
    except (OSError, ValueError, AttributeError) as err:
        raise PlanInputError("deepspeed", f"cannot read {path}: {err}") from None
    stage = zero.get("stage", 0)
    if not isinstance(stage, int):
        raise PlanInputError("deepspeed", f"zero_optimization.stage {stage!r} in {path} is not a number")

    def device(section: str) -> str:
        value = zero.get(section)
        return str(value.get("device", "none")) if isinstance(value, Mapping) else "none"

    return {
        "zeroStage": stage,
        "offloadOptimizer": device("offload_optimizer"),
        "offloadParams": device("offload_param"),
    }


def model_config(name_or_path: str, revision: str | None = None) -> tuple[str, dict[str, Any] | None]:
    """(what the planner reads the shape from, the model's config.json): a local folder as it is; a Hub id's
    config.json from the cache or the Hub (its snapshot folder); otherwise the name (the planner's table)."""
    local = Path(name_or_path).expanduser()
    file = local / "config.json"
    if not file.is_file():
        try:
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(name_or_path, "config.json", revision=revision))
        except (OSError, ValueError):  # offline and not cached, not a repo id, no such repo
            return name_or_path, None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return name_or_path, None
    return (str(file.parent), data) if isinstance(data, dict) else (name_or_path, None)


def plan_inputs_for(
    grpo: Mapping[str, Any],
    *,
    model: str,
    dtype: str,
    vllm: VLLMSettings,
    max_prompt_tokens: int | None,
    world_size: int,
    local_world_size: int,
    gpu_memory_gib: float,
    deepspeed: Mapping[str, Any],
) -> PlanInputs:
    """The planner's inputs for a job that runs as this process does (raises PlanInputError)."""
    spec = {
        "model": {"name": model, "dtype": dtype},
        "resources": {"nodes": max(1, world_size // max(1, local_world_size)), "gpusPerNode": local_world_size},
        "deepspeed": dict(deepspeed),
        "vllm": {
            "tensorParallelSize": vllm.tensor_parallel_size,
            "gpuMemoryUtilization": vllm.gpu_memory_utilization,
            "sleepPolicy": vllm.sleep_policy.value,
            "maxModelLen": vllm.max_model_len,
            "maxNumSeqs": vllm.max_num_seqs,
            "offloadTrainerState": vllm.offload_trainer_state,
        },
        "dataset": {"maxPromptTokens": max_prompt_tokens},
        "trainerArgs": dict(grpo),
    }
    return read_inputs(spec, gpu_memory_gib=gpu_memory_gib)


def merge_micro_batches(
    grpo: Mapping[str, Any],
    *,
    model: str,
    dtype: str,
    vllm: VLLMSettings,
    max_prompt_tokens: int | None,
    revision: str | None = None,
    pin: MergePin = "auto",
    environ: Mapping[str, str] = os.environ,
) -> tuple[dict[str, Any], MicroBatchMerge]:
    """`grpo` rewritten with the merged micro-batch, and this process's decision (`agree_merge` then makes one
    decision of every rank's)."""
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    local = int(environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    inputs: PlanInputs | None = None
    model_json: dict[str, Any] | None = None
    why = "no memory plan"
    gpu: float | None = None
    if pin == "auto" and not vllm.enabled:
        why = "no memory plan: the planner covers jobs with colocated vLLM"
    elif pin == "auto" and (gpu := gpu_memory_gib(environ)) is None:
        why = "no memory plan: no CUDA device"
    elif pin != "off":
        where, model_json = model_config(model, revision)  # a pinned factor is checked against it too
        if gpu is not None:
            try:
                inputs = plan_inputs_for(
                    grpo,
                    model=where,
                    dtype=dtype,
                    vllm=vllm,
                    max_prompt_tokens=max_prompt_tokens,
                    world_size=world,
                    local_world_size=local,
                    gpu_memory_gib=gpu,
                    deepspeed=deepspeed_settings(environ),
                )
            except PlanInputError as err:
                why = f"no memory plan: {err}"
    try:
        merge = plan_micro_batches(grpo, inputs, world_size=world, model_config=model_json, pin=pin, no_plan_reason=why)
    except ValueError as err:
        raise InvalidConfigError(f"{PIN_FIELD}: {err}") from err
    return merge.rewrite(grpo), merge


def agree_merge(local: MicroBatchMerge | None, problem: str | None = None) -> MicroBatchMerge:
    """The merge every rank runs: a collective, called by every rank once its process group exists.

    Each rank plans from its own facts (its GPU, the model config it could read), so ranks can differ; the number of
    forwards and backwards, which ZeRO-3 makes collectives, must not. Every rank takes the smallest factor any rank
    chose: a smaller factor divides the same G and S and needs less memory, so it fits wherever a larger one did.
    A rank that could not decide (`local` None, `problem` saying why) stops every rank with that reason.
    """
    rank_decisions: list[tuple[int | None, str | None]] = gather(
        (local.factor, local.reason) if local is not None else (None, problem)
    )
    factors = [factor for factor, _ in rank_decisions if factor is not None]
    if local is None or len(factors) < len(rank_decisions):
        raise InvalidConfigError(
            "the training micro-batch cannot be agreed, every rank stops: "
            + "; ".join(f"rank {rank}: {why}" for rank, (factor, why) in enumerate(rank_decisions) if factor is None)
        )
    agreed = min(factors)
    if agreed == local.factor:
        log.info("%s", local.message())
        return local
    log.warning(
        "this rank planned to merge its micro-batches %d into 1 (%s); every rank takes %d, the smallest of any "
        "rank (per rank: %s)",
        local.factor,
        local.reason,
        agreed,
        factors,
    )
    return dataclasses.replace(local, factor=agreed, reason=f"the smallest factor of any rank (per rank: {factors})")
