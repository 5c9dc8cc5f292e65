"""Old log-probs where the policy has not moved: from the training forward, not a forward of their own.

TRL 1.16 with colocated vLLM and its importance-sampling correction (on by default) runs one no-grad forward over
the whole generation batch right after generating: the trainer's log-probs of the sampled tokens under the policy
that generated them ("old"), for PPO's ratio and for the ratio to vLLM's own log-probs (the correction). A row
trained before the next optimizer step is trained by that same policy, so its training forward computes the same
log-probs anyway (TRL itself uses `per_token_logps.detach()` as the old ones when it skips the forward). Only rows
trained after an optimizer step need the extra forward. This module holds the pure parts of doing it that way:

- `deferrable_chunks`: which of a generation's micro-batches train before the next optimizer step;
- `scored_mask`: the tokens the correction covers;
- `importance_sampling_ratio`: TRL 1.16's correction (`_generate_and_score_completions`), all four modes;
- `SamplingStats`: the values TRL logs for it (`sampling/sampling_logp_difference/*`,
  `sampling/importance_sampling_ratio/*`) over a whole generation batch, per rank, before the gather.

`ColocGRPOTrainer` (trainer.py) wires them: the generation's own forward covers the later micro-batches only; an
earlier micro-batch's ratio and metrics come from its training forward. docs/trainer.md says what it buys.
"""

from __future__ import annotations

import math

import torch

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
METRIC_NAMES = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


def deferrable_chunks(micro_step: int, steps_per_generation: int, gradient_accumulation_steps: int) -> list[bool]:
    """For each of a generation's `steps_per_generation` micro-batches (chunk i trains at micro-step
    `micro_step + i`): True when no optimizer step comes between the generation and its training, so its
    training forward runs under the policy that generated it. An optimizer step ends every
    `gradient_accumulation_steps` micro-steps."""
    if steps_per_generation < 1 or gradient_accumulation_steps < 1 or micro_step < 0:
        raise ValueError("steps_per_generation and gradient_accumulation_steps must be >= 1, micro_step >= 0")
    into_step = micro_step % gradient_accumulation_steps
    return [into_step + i < gradient_accumulation_steps for i in range(steps_per_generation)]


def scored_mask(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The completion tokens the correction and its metrics cover, as TRL 1.16 masks them: `completion_mask`, times
    `tool_mask` (0 on tool-result tokens) when the micro-batch has one."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def importance_sampling_ratio(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """vLLM's importance-sampling correction as TRL 1.16 computes it: exp(old − sampling) per token (token modes,
    shape (B, T)) or per sequence (sequence modes, (B, 1)); truncated to [clip_min, clip_max] or, in the mask
    modes, zero outside it. Tokens vLLM could not score (NaN) count as a difference of 0."""
    if mode not in IS_MODES:
        raise ValueError(f"unknown vLLM importance sampling mode {mode!r}: one of {', '.join(IS_MODES)}")
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence_"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


class SamplingStats:
    """TRL's five sampling metrics (`METRIC_NAMES`) for one generation batch on this rank, added up over the
    parts it is scored in (the later micro-batches at once, each earlier one in its loss's forward), so that
    the values equal TRL's over the whole batch: the mean and max |old − sampling| over the completion tokens
    vLLM scored, and the correction's min, mean and max over those tokens (over sequences in the sequence
    modes); 0 where nothing was scored. The caller gathers them across ranks as TRL does."""

    def __init__(self, mode: str) -> None:
        self.sequence_level = mode.startswith("sequence_")
        self.deltas: list[torch.Tensor] = []
        self.ratios: list[torch.Tensor] = []

    def add(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor) -> None:
        valid = mask.bool()
        delta = torch.abs(old - sampling)
        self.deltas.append(delta[valid & ~torch.isnan(delta)])
        self.ratios.append(ratio.flatten() if self.sequence_level else ratio[valid])

    def values(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        delta = torch.cat(self.deltas) if self.deltas else torch.zeros(0, device=device)
        ratio = torch.cat(self.ratios) if self.ratios else torch.zeros(0, device=device)
        zero = torch.zeros((), device=delta.device)

        def reduce(values: torch.Tensor, op: str) -> torch.Tensor:
            return getattr(torch, op)(values) if values.numel() else zero

        reduced = (reduce(delta, "mean"), reduce(delta, "max"), reduce(ratio, "min"), reduce(ratio, "mean"))
        return dict(zip(METRIC_NAMES, (*reduced, reduce(ratio, "max")), strict=True))
