"""A DeepSpeed ZeRO-3 engine's trainer state, buffer by buffer: what `offload_states` moves.

Shared by the CPU tests (tests/training/test_trainer_state_offload.py, DeepSpeed's CPU
accelerator) and the GPU check (tests/gpu/test_trainer_state_offload.py). The buffers are the
ones DeepSpeed 0.19's `DeepSpeedZeroOptimizer_Stage3.offload_states` re-points, per
`OffloadStateTypeEnum` member: `lp_param_buffer` (lp_params), `grad_partitions_flat_buffer`
(lp_grads), `fp32_partitioned_groups_flat` (hp_params), the optimizer's `exp_avg` /
`exp_avg_sq` (optim_states) and the reduce buckets (contiguous_grad_buffer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from colocgrpo_dev.ports import free_port


def state_tensors(engine: Any) -> dict[str, list[Any]]:
    """The tensors holding each offloadable state, as DeepSpeed's ZeRO-3 optimizer keeps them."""
    opt = engine.optimizer
    inner = opt.optimizer
    moments = [s[k] for s in inner.state.values() for k in ("exp_avg", "exp_avg_sq") if k in s]
    return {
        "lp_params": [opt.lp_param_buffer],
        "lp_grads": [opt.grad_partitions_flat_buffer] if opt.grad_partitions_flat_buffer is not None else [],
        "hp_params": list(opt.fp32_partitioned_groups_flat),
        "optim_states": moments,
        "contiguous_grad_buffer": [b.buffer for b in opt.ipg_buckets.values() if b.buffer is not None],
    }


def storages(engine: Any) -> dict[str, dict[int, int]]:
    """Per state: {storage address: bytes} of the storages its tensors live in."""
    out: dict[str, dict[int, int]] = {}
    for state, tensors in state_tensors(engine).items():
        out[state] = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return out


def moved_bytes(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]) -> dict[str, int]:
    """Bytes of each state's storages that `offload_states` replaced (the tensor now lives elsewhere).

    Compares addresses: valid only while every storage of `before` is still alive, or the allocator
    can hand a freed one's address to a new buffer (see `moved_by`)."""
    return {
        state: sum(n for ptr, n in held.items() if ptr not in after.get(state, {}))
        for state, held in before.items()
        if any(ptr not in after.get(state, {}) for ptr in held)
    }


def moved_by(engine: Any, offload: Callable[[], None]) -> dict[str, int]:
    """Bytes of each state's storages that `offload()` replaced, as `moved_bytes` counts them.

    The storages of before stay referenced until after the comparison. Otherwise a storage the
    offload frees can be reused at once for the next new buffer: on DeepSpeed's CPU accelerator the
    "offloaded" copies are host buffers from the same allocator, so a moment moved into the address
    its sibling just left would look as if it had never moved. The storages, not the tensors: the
    offload re-points a tensor in place (`state["exp_avg"].data = copy`), which drops the tensor's
    old storage however long the tensor itself is held."""
    held = [tensor.untyped_storage() for tensors in state_tensors(engine).values() for tensor in tensors]
    before = storages(engine)
    offload()
    moved = moved_bytes(before, storages(engine))
    del held
    return moved


def snapshot(engine: Any) -> dict[str, Any]:
    """Copies (on the CPU) of everything the offload touches, for bit-for-bit comparisons: each
    parameter's partition in module order, the flat buffers, fp32 masters and Adam moments."""
    out = {f"param:{name}": p.ds_tensor.detach().cpu().clone() for name, p in engine.module.named_parameters()}
    for state, tensors in state_tensors(engine).items():
        if state == "contiguous_grad_buffer":
            continue  # scratch space: DeepSpeed does not restore its data, nothing reads it between steps
        for i, t in enumerate(tensors):
            out[f"{state}[{i}]"] = t.detach().cpu().clone()
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    import torch

    keys = sorted(set(a) | set(b))
    return [k for k in keys if k not in a or k not in b or a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]


@contextlib.contextmanager
def relabelled_as_fused_adam(engine: Any) -> Iterator[None]:
    """CPU only: DeepSpeed's FusedAdam is a CUDA op, and ZeRO-3's `offload_states` asserts that class
    before moving moments and fp32 masters. A torch AdamW keeps the same `exp_avg` / `exp_avg_sq` state
    entries DeepSpeed's offload moves, so for the duration of an offload call it wears FusedAdam's class;
    nothing steps while it does. The GPU check uses the real FusedAdam."""
    from deepspeed.ops.adam.fused_adam import FusedAdam

    inner = engine.optimizer.optimizer
    original = inner.__class__
    inner.__class__ = FusedAdam
    try:
        yield
    finally:
        inner.__class__ = original


def single_process_env() -> dict[str, str]:
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def zero3_config(
    gradient_accumulation_steps: int = 1, offload_optimizer: bool = False, bucket: int = 1000
) -> dict[str, Any]:
    """ZeRO-3 as the operator renders it for several GPUs (every large parameter released after use),
    with concrete numbers where the rendering says "auto" (transformers fills those)."""
    zero: dict[str, Any] = {
        "stage": 3,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "reduce_bucket_size": bucket,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": bucket,
    }
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        # A torch optimizer under ZeRO-Offload (the CPU tests; accelerate swaps in DeepSpeed's CPU Adam).
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def grouped_parameters(model: Any, weight_decay: float = 0.01) -> list[dict[str, Any]]:
    """transformers' split: decay for matrices, none for norms and biases. It orders the optimizer's
    groups unlike `module.parameters()`, the order DeepSpeed's offload re-maps partitions in."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
