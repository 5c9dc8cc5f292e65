"""Gradient checkpointing on some decoder layers only, kept through TRL's no-grad forwards.

The planner may checkpoint only the first k decoder layers where the others' activations fit
(planner/micro_batches.py, `Recompute`); `PartialRecompute` keeps the later layers whole once the Trainer has turned
checkpointing on. The last layers are the ones kept: the backward reaches them first and frees their activations
before the first recompute. transformers' own `gradient_checkpointing_kwargs.every_n_layers` offers only
ceil(layers / n) checkpointed layers (16 or 32 of 32), and TRL 1.16 loses it: each generation's no-grad forwards run
under `trl.models.utils.disable_gradient_checkpointing`, which re-enables checkpointing afterwards with
`gradient_checkpointing_enable(gradient_checkpointing_kwargs)`, so every layer is checkpointed again and torch's
checkpoint receives `every_n_layers` and raises "Unexpected keyword arguments: every_n_layers" in the next backward
(tests/training/test_micro_batch_merge_cpu.py shows it with TRL's own GRPOTrainer). `checkpointing_kept` restores
each module's flag and checkpoint function exactly as they were instead, whichever way the pattern was set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

_FLAG = "gradient_checkpointing"
_FUNCTION = "_gradient_checkpointing_func"
_UNSET = object()


@contextlib.contextmanager
def checkpointing_kept(model: Any) -> Iterator[None]:
    """Every module's checkpointing flag and function put back as they were when the block ends, whatever the
    block did to them."""
    saved = [
        (module, getattr(module, _FLAG), module.__dict__.get(_FUNCTION, _UNSET))
        for module in model.modules()
        if hasattr(module, _FLAG)
    ]
    try:
        yield
    finally:
        for module, flag, function in saved:
            setattr(module, _FLAG, flag)
            if function is _UNSET:
                module.__dict__.pop(_FUNCTION, None)
            else:
                setattr(module, _FUNCTION, function)


@contextlib.contextmanager
def checkpointing_paused(model: Any) -> Iterator[None]:
    """No module checkpoints inside the block (a no-grad forward has nothing to recompute); afterwards every module
    is as before."""
    with checkpointing_kept(model):
        for module in model.modules():
            if getattr(module, _FLAG, False):
                setattr(module, _FLAG, False)
        yield


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers (transformers' `GradientCheckpointingLayer`s), in forward order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def layer_checkpointing(model: Any) -> list[bool]:
    """Each decoder layer's checkpointing flag, in order: what the next training backward recomputes."""
    return [bool(layer.gradient_checkpointing) for layer in decoder_layers(model)]


def checkpoint_first_layers(model: Any, checkpointed: int) -> None:
    """With checkpointing on, every decoder layer after the first `checkpointed` keeps its activations instead."""
    for layer in decoder_layers(model)[checkpointed:]:
        layer.gradient_checkpointing = False


class PartialRecompute(TrainerCallback):
    """Checkpointing on the first `checkpointed` decoder layers only: at the start of training, after the Trainer
    turned it on for every layer, the later layers keep their activations instead."""

    def __init__(self, checkpointed: int) -> None:
        if checkpointed < 1:
            raise ValueError(
                f"checkpointed_layers must be at least 1 (none: gradient_checkpointing off), got {checkpointed}"
            )
        self.checkpointed = checkpointed

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if args.gradient_checkpointing and model is not None:
            checkpoint_first_layers(model, self.checkpointed)
