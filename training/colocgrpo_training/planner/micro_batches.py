"""Fewer, larger training micro-batches where TRL 1.16 computes the same step and the memory plan allows.

Under ZeRO-3 every micro-batch pays a large fixed cost (per-module hooks, gradient reduction into the
partitions): at 7.18B on an H200 one optimizer step of 64 rows took 2.12 s as 4 micro-batches of 16 and 1.23 s
as 2 of 32, with the same loss and gradient norm (docs/benchmarks/gpu.md, "Larger micro-batches").
`plan_micro_batches` picks a merge factor k and rewrites

    per_device_train_batch_size B -> k*B,  gradient_accumulation_steps G -> G/k,  steps_per_generation S -> S/k

so the rows per optimizer step (B*G per GPU) and per generation (B*S per GPU, the `generation_batch_size`) stay.
k divides both G and S; it is 1 when the merged run would not compute the same step, or would not fit.

Why the merged run computes the same step, in TRL 1.16's `GRPOTrainer` (grpo_trainer.py):

- Data: `RepeatSampler` permutes the prompts with its own seeded generator and yields each generation batch's
  prompts `num_iterations * S` times; the dataloader's batch is `B * S` rows, so the distinct generation batches,
  their order and the epoch length in optimizer steps are the same (the sampler's length shrinks by k, and so does
  G). `_prepare_inputs` generates once per `S * num_iterations` micro-steps, shuffles the generation batch with
  `torch.randperm` over the same number of rows, and `split_tensor_dict` cuts it into S contiguous slices: merged
  slice j is unmerged slices k*j .. k*j+k-1, and an optimizer step's G/k merged micro-steps cover exactly the rows
  of its G unmerged ones. An epoch's last, shorter step keeps the same rows too (the micro-steps per epoch are a
  multiple of S, so of k).
- Generation and everything computed over the generation batch (rewards, group advantages, `num_items_in_batch`,
  importance-sampling ratios, reference log-probs, vLLM's `max_num_seqs = B * TP * S`) is unchanged; whether old
  log-probs are computed at all (`G % (S * num_iterations)`) is unchanged. No-grad forwards take more rows per
  chunk: the same values (rows are independent).
- The loss: every loss type that is a sum over rows divided by a number that does not depend on how the rows are
  cut gives the same gradient summed over an optimizer step. `grpo`, `sapo` and `luspo` average per-row values over
  the micro-batch's rows and divide by G: sum over rows / (B*G) either way. `dr_grpo` divides by
  rows * max_completion_length * G: the same. `dapo`, `cispo` and `vespo` divide by the generation batch's token
  count x G / S: the same. transformers does not rescale (TRL sets `loss_is_scaled_for_ga`) and DeepSpeed gets
  `scale_wrt_gas=False`. Per-token and per-sequence terms (clipping, `delta`, the off-policy mask, the KL term,
  importance weights) are row-local.

Where it is not the same, k stays 1 (`exactness_problems`):

- `loss_type: bnpo` divides each micro-batch by its own token count: rows are weighted per micro-batch.
- `top_entropy_quantile < 1` takes the entropy quantile over each micro-batch's tokens.
- The entropy bonus (`entropy_coef != 0` or `use_adaptive_entropy`) is each micro-batch's token mean.
- A Mixture-of-Experts router loss (a model config with router logits, unless `router_aux_loss_coef: 0`) balances
  the experts over each forward's tokens.
- Dropout in the model (a config `*dropout*` / `*pdrop*` above 0): masks are drawn per forward, so the values and
  the global random stream (and with it later shuffles) differ; the distribution is the same, the numbers are not.
- A loss type this rule does not know.

What does differ: floating-point summation order (one backward of k*B rows against k accumulated ones), and
logged metrics that TRL averages per micro-batch (e.g. `entropy`, the clip ratios' min/max), which are then
averages over fewer, larger micro-batches.

Memory: the planner's training-phase peak (`plan.plan_inputs`) with B' rows per micro-batch and S' steps per
generation, against the GPU less the planner's tight-headroom slack (`TIGHT_HEADROOM_FRACTION`). Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from colocgrpo_training.config import MergePin
from colocgrpo_training.planner.inputs import PlanInputs
from colocgrpo_training.planner.merge import MicroBatchMerge, Recompute
from colocgrpo_training.planner.plan import TIGHT_HEADROOM_FRACTION, plan_inputs

# How each loss type normalises a micro-batch's loss in TRL 1.16 `_compute_loss`.
EXACT_LOSS_TYPES: dict[str, str] = {
    "grpo": "per-row means averaged over the rows, / G",
    "sapo": "per-row means averaged over the rows, / G",
    "luspo": "per-row sums averaged over the rows, / G",
    "dr_grpo": "/ (rows x max_completion_length x G)",
    "dapo": "/ (the generation batch's tokens x G / S)",
    "cispo": "/ (the generation batch's tokens x G / S)",
    "vespo": "/ (the generation batch's tokens x G / S)",
}
INEXACT_LOSS_TYPES: dict[str, str] = {
    "bnpo": "loss_type bnpo divides each micro-batch by its own token count",
}
# TrainingArguments / GRPOConfig defaults of the settings read here.
DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "loss_type": "dapo",
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "router_aux_loss_coef": None,
}
_MOE_KEYS = ("output_router_logits", "num_experts", "num_local_experts", "n_routed_experts")

# Where a job pins the merge, named in the decision's reason.
PIN_FIELD = "spec.training.microBatchMerge"


def _setting(grpo: Mapping[str, Any], key: str) -> Any:
    value = grpo.get(key)
    return DEFAULTS.get(key) if value is None else value


def dropout_settings(model_config: Mapping[str, Any]) -> list[str]:
    """The model config's dropout settings above 0 (`*dropout*`, `*pdrop*`, its text config's too), as "key value"."""
    configs = [model_config]
    text = model_config.get("text_config")
    if isinstance(text, Mapping):
        configs.append(text)
    return sorted(
        f"{key} {value}"
        for config in configs
        for key, value in config.items()
        if ("dropout" in key or "pdrop" in key)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value > 0
    )


def exactness_problems(grpo: Mapping[str, Any], model_config: Mapping[str, Any] | None = None) -> list[str]:
    """Why a merged run would not compute the same step (empty: it would). `grpo` holds GRPOConfig keyword
    arguments; `model_config` the model's config.json, when known."""
    problems = []
    loss_type = str(_setting(grpo, "loss_type"))
    if loss_type in INEXACT_LOSS_TYPES:
        problems.append(INEXACT_LOSS_TYPES[loss_type])
    elif loss_type not in EXACT_LOSS_TYPES:
        problems.append(f"loss_type {loss_type} is not one whose normalisation this rule knows")
    quantile = _setting(grpo, "top_entropy_quantile")
    if quantile < 1.0:
        problems.append(f"top_entropy_quantile {quantile} takes the entropy quantile over each micro-batch")
    if _setting(grpo, "entropy_coef") != 0.0 or _setting(grpo, "use_adaptive_entropy"):
        problems.append("the entropy bonus (entropy_coef, use_adaptive_entropy) is each micro-batch's token mean")
    if model_config is not None:
        text = model_config.get("text_config")
        keys = set(model_config) | (set(text) if isinstance(text, Mapping) else set())
        if any(key in keys for key in _MOE_KEYS) and _setting(grpo, "router_aux_loss_coef") != 0.0:
            problems.append("the Mixture-of-Experts router loss balances experts over each forward's tokens")
        dropout = dropout_settings(model_config)
        if dropout:
            problems.append(f"dropout ({', '.join(dropout)}) draws its masks per forward")
    return problems


def batch_shape(grpo: Mapping[str, Any], world_size: int) -> tuple[int, int, int]:
    """(B, G, S) as GRPOConfig.__post_init__ resolves them: S is steps_per_generation, else generation_batch_size
    / (B x world size), else G."""
    b = int(_setting(grpo, "per_device_train_batch_size"))
    g = int(_setting(grpo, "gradient_accumulation_steps"))
    s = grpo.get("steps_per_generation")
    if s is None and grpo.get("generation_batch_size") is not None:
        s = int(grpo["generation_batch_size"]) // (b * max(1, world_size))
    return b, g, int(s) if s is not None else g


def factors(gradient_accumulation_steps: int, steps_per_generation: int) -> list[int]:
    """Every k that divides both, largest first (1 always)."""
    common = math.gcd(max(1, gradient_accumulation_steps), max(1, steps_per_generation))
    return [k for k in range(common, 0, -1) if common % k == 0]


def plan_micro_batches(
    grpo: Mapping[str, Any],
    inputs: PlanInputs | None,
    *,
    world_size: int = 1,
    model_config: Mapping[str, Any] | None = None,
    pin: MergePin = "auto",
    no_plan_reason: str = "no memory plan",
) -> MicroBatchMerge:
    """The merge factor for GRPOConfig keyword arguments `grpo`.

    Args:
        grpo: GRPOConfig keyword arguments (TRL's names; unset keys take TRL's defaults).
        inputs: the memory planner's inputs for this job as configured (`inputs.resolve_inputs`); None when there is
            no plan (a CPU job, an unknown model): nothing merges then unless `pin` names a factor.
        world_size: training processes (resolves steps_per_generation from generation_batch_size).
        model_config: the model's config.json, for the rules that depend on the model (router loss, dropout).
        pin: "auto" (the largest exact factor that fits), "off" (1), or a factor to use as given; a factor that
            does not divide G and S, or a merge that would not be exact, raises ValueError.
        no_plan_reason: the reason reported when `inputs` is None.

    Returns:
        [`MicroBatchMerge`]: the factor, the settings before, the reason, and the planner's training-phase peak of
        each factor it considered.
    """
    b, g, s = batch_shape(grpo, world_size)
    candidates = factors(g, s)

    def decision(
        k: int, reason: str, peaks: tuple[tuple[int, float], ...] = (), limit: float | None = None
    ) -> MicroBatchMerge:
        return MicroBatchMerge(k, b, g, s, reason, peaks, limit)

    if pin == "off":
        return decision(1, f"merging is off ({PIN_FIELD}: off)")
    problems = exactness_problems(grpo, model_config)
    if isinstance(pin, int):
        if pin < 1 or pin not in candidates:
            raise ValueError(
                f"micro-batch merge factor {pin} must divide gradient_accumulation_steps {g} and "
                f"steps_per_generation {s} (possible: {', '.join(map(str, sorted(candidates)))})"
            )
        if pin > 1 and problems:
            raise ValueError(f"micro-batch merge factor {pin} would change the step: {'; '.join(problems)}")
        return decision(pin, f"pinned to {pin} ({PIN_FIELD}: {pin}), memory not checked")
    unmerged = "; ".join(problems)
    if not problems and len(candidates) == 1:
        unmerged = f"gradient_accumulation_steps {g} and steps_per_generation {s} have no common factor"
    if inputs is None:
        return decision(1, unmerged or no_plan_reason)
    limit = (1 - TIGHT_HEADROOM_FRACTION) * inputs.gpu_memory_gib
    if unmerged:
        return less_recompute(decision(1, unmerged, (), limit), grpo, inputs)

    peaks: list[tuple[int, float]] = []
    for k in candidates:  # largest first; the peak grows with k
        peaks.append((k, plan_inputs(_merged(inputs, b, s, k)).per_gpu_training_gib))
        if peaks[-1][1] <= limit:
            break
    k, peak = peaks[-1]
    budget = f"{limit:.1f} GiB ({100 - round(100 * TIGHT_HEADROOM_FRACTION)} % of {inputs.gpu_memory_gib:.1f})"
    if peak > limit:
        return decision(
            1, f"the planner's training peak is {peak:.1f} GiB unmerged, over {budget}", tuple(peaks), limit
        )
    if k == 1:
        smallest, needed = peaks[-2]
        merge = decision(1, f"merging {smallest} would need {needed:.1f} GiB, over {budget}", tuple(peaks), limit)
        return less_recompute(merge, grpo, inputs)
    loss_type = _setting(grpo, "loss_type")
    why = f"the same step ({loss_type}: {EXACT_LOSS_TYPES[loss_type]}); training peak {peak:.1f} GiB within {budget}"
    if len(peaks) > 1:
        why += f"; merging {peaks[-2][0]} would need {peaks[-2][1]:.1f} GiB"
    return less_recompute(decision(k, why, tuple(peaks), limit), grpo, inputs)


def _merged(inputs: PlanInputs, b: int, s: int, k: int) -> PlanInputs:
    return dataclasses.replace(inputs, per_device_train_batch_size=b * k, steps_per_generation=max(1, s // k))


def less_recompute(merge: MicroBatchMerge, grpo: Mapping[str, Any], inputs: PlanInputs | None) -> MicroBatchMerge:
    """`merge` with less gradient checkpointing where the job leaves it to the planner and memory allows.

    GRPOConfig checkpoints every decoder layer by default: the backward recomputes each layer's forward, a third
    more work for the training step, to hold one layer's input instead of all its activations. The merge is decided
    first (fewer micro-batches save more than the recompute costs under ZeRO-3: docs/benchmarks/gpu.md), then, at
    the merged micro-batch, the fewest checkpointed layers whose training peak is within the same limit: none, else
    the first k of the model's layers, the others keeping their activations. A job that sets
    `gradient_checkpointing` (either way) or `gradient_checkpointing_kwargs` keeps its setting; so does a job
    without a memory plan. The decision uses only the plan's inputs, so every rank that plans the same inputs
    decides the same, and `agree_merge` takes the most checkpointed of any rank's (the recompute changes the number
    of ZeRO-3 gathers)."""
    chosen = any(grpo.get(key) is not None for key in ("gradient_checkpointing", "gradient_checkpointing_kwargs"))
    if inputs is None or merge.limit_gib is None or chosen or not inputs.gradient_checkpointing:
        return merge
    merged = _merged(inputs, merge.per_device_train_batch_size, merge.steps_per_generation, merge.factor)
    layers = inputs.shape.num_layers
    for checkpointed in range(layers):  # the fewest first (not always the largest peak: k = 1 adds a recompute)
        pattern = dataclasses.replace(merged, checkpointed_layers=checkpointed, whole_layers_last=True)
        peak = plan_inputs(pattern).per_gpu_training_gib
        if peak <= merge.limit_gib:
            return dataclasses.replace(merge, recompute=Recompute(checkpointed, layers, peak))
    return merge
