"""This training process's facts → the memory planner's inputs → the micro-batch merge (planner/micro_batches.py).

`merge_micro_batches` is what a real job (`grpo_args.build_grpo_config`) and the GPU benchmark's own contenders
(bench/grpo/) call on their GRPOConfig keyword arguments before building the GRPOConfig, as a `PlanRequest` (a real
job's from its trainer config: `planner.from_trainer_config`). The facts it reads:

- the request's (the trainer config's `resources`, `deepspeed` and `training.micro_batch_merge`, as the operator
  renders them from the spec): the gang's shape, the ZeRO stage and offloads of its deepspeed.json, the pin;
- the GPU's memory: `resources.gpu_memory_gib` where the job sets it (a GPU shared with other work, a MIG slice),
  else torch's `total_memory` of this process's device (`LOCAL_RANK`), the number vLLM's utilization multiplies;
  no CUDA device, no plan;
- the model's shape: its config.json (a local folder, else the Hugging Face cache or Hub, where the trainer loads
  the model from anyway), else the planner's built-in table by name.

The pin: `auto` (default), `off`, or a factor to use as given (it must divide gradient_accumulation_steps and
steps_per_generation, and the merge must be exact).

Each rank plans alone, before the process group exists; `agree_merge` then makes the factor every rank's smallest and
checkpoints the most layers any rank planned to (the number of forwards, backwards and recomputes, collectives under
ZeRO-3, must be equal on every rank).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from colocgrpo_training.agreement import gather
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.planner.inputs import PlanInputs, resolve_inputs
from colocgrpo_training.planner.merge import MicroBatchMerge, Recompute
from colocgrpo_training.planner.micro_batches import PIN_FIELD, plan_micro_batches
from colocgrpo_training.planner.request import PlanRequest
from colocgrpo_training.planner.shapes import PlanInputError

log = logging.getLogger("colocgrpo.micro_batches")

GIB = 1024**3


def device_memory_gib() -> float | None:
    """The memory of this process's GPU in GiB, as torch's total_memory counts it; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = int(os.environ.get("LOCAL_RANK", "0") or 0)  # the launcher's: which of the pod's GPUs is this one
    return torch.cuda.get_device_properties(device).total_memory / GIB


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


def _device_memory_gib() -> float | None:
    """`device_memory_gib`, its failure an InvalidConfigError: a rank that cannot plan must still take part in
    `agree_merge`, which stops every rank with its reason."""
    try:
        return device_memory_gib()
    except RuntimeError as err:  # CUDA's errors
        raise InvalidConfigError(f"cannot read this GPU's memory: {err}") from err


def merge_micro_batches(request: PlanRequest, *, revision: str | None = None) -> tuple[dict[str, Any], MicroBatchMerge]:
    """`request.trainer_args` (GRPOConfig keyword arguments) rewritten with the merged micro-batch, and this process's
    decision (`agree_merge` then makes one decision of every rank's).

    Args:
        request: the job as this process runs it (`planner.from_trainer_config`); `resources.gpu_memory_gib` None
            plans for this process's GPU.
        revision: the model's Hub revision, to read its config.json.

    Raises:
        InvalidConfigError: the pinned factor does not divide G and S or would change the step, or this GPU's memory
            cannot be read.
    """
    grpo, pin = request.trainer_args, request.micro_batch_merge
    inputs: PlanInputs | None = None
    model_json: dict[str, Any] | None = None
    why = "no memory plan"
    gpu = request.resources.gpu_memory_gib
    if pin == "auto" and not request.vllm.enabled:
        why = "no memory plan: the planner covers jobs with colocated vLLM"
    elif pin == "auto" and gpu is None and (gpu := _device_memory_gib()) is None:
        why = "no memory plan: no CUDA device"
    elif pin != "off":
        where, model_json = model_config(request.model, revision)  # a pinned factor is checked against it too
        if gpu is not None:
            resources = request.resources.model_copy(update={"gpu_memory_gib": gpu})
            try:
                inputs = resolve_inputs(dataclasses.replace(request, model=where, resources=resources))
            except PlanInputError as err:
                why = f"no memory plan: {err}"
    try:
        merge = plan_micro_batches(
            grpo,
            inputs,
            world_size=request.resources.world_size,
            model_config=model_json,
            pin=pin,
            no_plan_reason=why,
        )
    except ValueError as err:
        raise InvalidConfigError(f"{PIN_FIELD}: {err}") from err
    return merge.rewrite(grpo), merge


def agree_merge(local: MicroBatchMerge | None, problem: str | None = None) -> MicroBatchMerge:
    """The merge every rank runs: a collective, called by every rank once its process group exists.

    Each rank plans from its own facts (its GPU, the model config it could read), so ranks can differ; the number of
    forwards and backwards, which ZeRO-3 makes collectives, must not. Every rank takes the smallest factor any rank
    chose: a smaller factor divides the same G and S and needs less memory, so it fits wherever a larger one did.
    Every rank takes the most checkpointed layers any rank planned (as configured, every layer, where a rank left
    it as configured): each recomputed layer is a chain of ZeRO-3 gathers, and more checkpointing needs less memory,
    so it fits wherever less did. A rank that could not decide (`local` None, `problem` saying why) stops every rank
    with that reason.
    """
    rank_decisions: list[tuple[int | None, str | None, Recompute | None]] = gather(
        (local.factor, local.reason, local.recompute) if local is not None else (None, problem, None)
    )
    factors = [factor for factor, _, _ in rank_decisions if factor is not None]
    if local is None or len(factors) < len(rank_decisions):
        raise InvalidConfigError(
            "the training micro-batch cannot be agreed, every rank stops: "
            + "; ".join(f"rank {rank}: {why}" for rank, (factor, why, _) in enumerate(rank_decisions) if factor is None)
        )
    agreed = local
    plans = [recompute for _, _, recompute in rank_decisions]
    most = max(plans, key=_checkpointed)  # the first rank's of the most checkpointed: the same on every rank
    if _checkpointed(most) != _checkpointed(local.recompute):
        log.warning(
            "this rank planned gradient checkpointing on %s; every rank runs it on %s, the most of any rank "
            "(per rank: %s)",
            _describe(local.recompute),
            _describe(most),
            [_describe(plan) for plan in plans],
        )
        agreed = dataclasses.replace(agreed, recompute=most)
    smallest = min(factors)
    if smallest == local.factor:
        log.info("%s", agreed.message())
        return agreed
    log.warning(
        "this rank planned to merge its micro-batches %d into 1 (%s); every rank takes %d, the smallest of any "
        "rank (per rank: %s)",
        local.factor,
        local.reason,
        smallest,
        factors,
    )
    return dataclasses.replace(agreed, factor=smallest, reason=f"the smallest factor of any rank (per rank: {factors})")


def _checkpointed(recompute: Recompute | None) -> float:
    """How many layers a rank's plan checkpoints (the first ones); as configured counts as every layer."""
    return math.inf if recompute is None else recompute.checkpointed_layers


def _describe(recompute: Recompute | None) -> str:
    if recompute is None:
        return "every layer, as configured"
    if recompute.off:
        return "no layer"
    return f"{recompute.checkpointed_layers} of {recompute.num_layers} layers"
