"""ZeRO-3's knobs for a job: chosen here from the model's shape and where its parameters live.

The operator writes them into the job's deepspeed.json (`colocgrpo_operator.render.deepspeed_config`), the memory
plan counts the gradient bucket they size, and `colocgrpo plan` shows each with its reason. One file serves every
rank of a job, so every rank runs the same knobs, and with them the same collectives.

Two layouts:

- **one GPU, parameters resident** (one training process, `offloadParams: none`, no trainer-state offload): every
  ZeRO-3 "partition" is a whole parameter, so releasing one after use saves nothing and re-fetching it costs a
  stream synchronize each time; nothing is communicated, so a bucket is only a flush.
- **partitioned** (several processes, or parameters offloaded): the gradient bucket holds one decoder layer's
  gradients, so the backward issues one reduce-scatter per layer, overlapped with the next layer's backward
  (`overlap_comm`), instead of transformers' `auto` (hidden_size² elements), which flushes about once per weight
  matrix: at 4 ranks, 76 reduce-scatters a step against 2 for the same bytes (docs/benchmarks/zero3.md). The
  prefetch bucket and the persistence threshold keep transformers' rules (0.9·hidden² and 10·hidden elements:
  norms and biases stay whole), written out so the file says what runs.

A model whose shape is unknown (not in the table, no config.json, no parameter count) gets transformers' `auto` for
the shape-sized knobs: the plan cannot size them, transformers can once the model is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from colocgrpo_training.planner.shapes import ModelShape

# A ZeRO-3 parameter at or under this many elements is never released after use. DeepSpeed's int maximum: every
# parameter, whatever the model.
EVERY_PARAMETER = 2**63 - 1
# DeepSpeed's own reduce_bucket_size default (elements).
DEEPSPEED_DEFAULT_BUCKET_ELEMENTS = 500_000_000
# transformers' "auto" (integrations/deepspeed.py, `trainer_config_finalize`): fills these from hidden_size.
TRANSFORMERS_AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Zero3Knob:
    """One `zero_optimization` key of the rendered deepspeed.json."""

    key: str
    value: int | bool | str  # "auto": transformers fills it from hidden_size
    why: str


@dataclasses.dataclass(frozen=True)
class Zero3Knobs:
    """The planner's ZeRO-3 knobs for one job, in the order the plan shows them."""

    layout: str  # "one GPU, parameters resident" | "partitioned"
    knobs: tuple[Zero3Knob, ...]

    def section(self) -> dict[str, Any]:
        """The knobs as `zero_optimization` keys."""
        return {k.key: k.value for k in self.knobs}

    def value(self, key: str) -> int | bool | str:
        """The value of `key`; KeyError when the planner sets no such knob."""
        return self.section()[key]

    def bucket_elements(self, hidden_size: int) -> int:
        """The contiguous gradient bucket's elements, as DeepSpeed allocates it: `auto` is hidden_size²."""
        value = self.value("reduce_bucket_size")
        return hidden_size * hidden_size if value == TRANSFORMERS_AUTO else int(value)

    def lines(self) -> list[str]:
        out = [f"ZeRO-3 knobs ({self.layout}; written into deepspeed.json, the same for every rank):"]
        for knob in self.knobs:
            shown = (
                f"{knob.value:,}" if isinstance(knob.value, int) and not isinstance(knob.value, bool) else knob.value
            )
            if knob.value == EVERY_PARAMETER:
                shown = "every parameter"
            out.append(f"  {knob.key:<36} {shown!s:>16}  ({knob.why})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "knobs": [dataclasses.asdict(k) for k in self.knobs]}


def one_gpu_resident(world_size: int, offload_parameters: bool, offload_trainer_state: bool) -> bool:
    """One training process whose parameters stay on its GPU, also while vLLM generates.

    Not with the trainer-state offload: DeepSpeed's offload_states moves each parameter's partition but not a
    resident parameter's own view of it, so the GPU copy would stay alive (nothing offloaded) and reload_states
    would allocate a second one beside it."""
    return world_size == 1 and not offload_parameters and not offload_trainer_state


def zero3_knobs(
    shape: ModelShape | None, *, world_size: int, offload_parameters: bool, offload_trainer_state: bool
) -> Zero3Knobs:
    """The ZeRO-3 knobs of a job.

    Args:
        shape: the model's shape; None when the planner cannot know it (the shape-sized knobs are then `auto`).
        world_size: training processes in the job (nodes × gpusPerNode).
        offload_parameters: `spec.deepspeed.offloadParams` is not `none`.
        offload_trainer_state: `spec.vllm.offloadTrainerState`.

    Returns:
        The knobs, each with its reason; `section()` gives them as `zero_optimization` keys.
    """
    if one_gpu_resident(world_size, offload_parameters, offload_trainer_state):
        return Zero3Knobs(
            "one GPU, parameters resident",
            (
                Zero3Knob(
                    "reduce_bucket_size",
                    DEEPSPEED_DEFAULT_BUCKET_ELEMENTS,
                    "DeepSpeed's default: one process communicates nothing, a bucket is only a flush",
                ),
                _prefetch(shape),
                Zero3Knob(
                    "stage3_param_persistence_threshold",
                    EVERY_PARAMETER,
                    "every parameter stays whole: releasing saves nothing on one GPU, and each re-fetch (forward, "
                    "recompute, backward) ends in a stream synchronize",
                ),
                Zero3Knob(
                    "memory_efficient_linear",
                    False,
                    "DeepSpeed's F.linear replacement only frees weights the backward keeps alive anyway here, and "
                    "it is installed for the whole process, vLLM's layers included",
                ),
            ),
        )
    if shape is None:
        bucket = Zero3Knob("reduce_bucket_size", TRANSFORMERS_AUTO, "model shape unknown: transformers fills hidden²")
        persistence = Zero3Knob(
            "stage3_param_persistence_threshold", TRANSFORMERS_AUTO, "model shape unknown: transformers fills 10·hidden"
        )
    else:
        h = shape.hidden_size
        layer = shape.layer_parameters()
        elements = min(DEEPSPEED_DEFAULT_BUCKET_ELEMENTS, max(h * h, layer))
        bucket = Zero3Knob(
            "reduce_bucket_size",
            elements,
            "one decoder layer's gradients per reduce-scatter, overlapped with the next layer's backward"
            if elements == layer
            else f"{'hidden²' if elements == h * h else 'DeepSpeed default'}, the nearest bound to one decoder layer",
        )
        persistence = Zero3Knob(
            "stage3_param_persistence_threshold", 10 * h, "10·hidden, transformers' rule: norms and biases stay whole"
        )
    return Zero3Knobs("partitioned", (bucket, _prefetch(shape), persistence))


def _prefetch(shape: ModelShape | None) -> Zero3Knob:
    if shape is None:
        return Zero3Knob(
            "stage3_prefetch_bucket_size", TRANSFORMERS_AUTO, "model shape unknown: transformers fills 0.9·hidden²"
        )
    h = shape.hidden_size
    return Zero3Knob("stage3_prefetch_bucket_size", int(0.9 * h * h), "0.9·hidden², transformers' rule")
