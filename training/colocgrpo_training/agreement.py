"""Values every training process agrees on, so that decisions changing collectives are equal on every rank.

Under DeepSpeed ZeRO-3 every forward and backward is a chain of all-gathers and reduce-scatters over all ranks, and
every colocated generate ends in collectives too (the sleep decision, the weight push). A decision that changes how
many of them a rank runs, or in what order (the micro-batch merge, the rows per no-grad forward, a skipped forward, an
early stop), must therefore be the same on every rank: derived only from values equal everywhere, or agreed through
one of these functions. docs/trainer.md lists the decisions and how each is agreed.

Each function is itself a collective: every rank calls it at the same point, the same number of times. Without an
initialized process group (one process) they return the local value.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def _world() -> Any:
    """torch.distributed when a process group of more than one rank exists, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(value: float, op: str) -> float:
    dist = _world()
    if dist is None:
        return value
    import torch

    tensor = torch.tensor([value], dtype=torch.float64, device=_device(dist))
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return float(tensor.item())


def agree_max(value: float) -> float:
    """The largest of every rank's `value`."""
    return _reduce(value, "MAX")


def agree_min(value: float) -> float:
    """The smallest of every rank's `value`."""
    return _reduce(value, "MIN")


def any_rank(flag: bool) -> bool:
    """True on every rank when it is True on any."""
    return agree_max(1.0 if flag else 0.0) > 0


def gather(value: T) -> list[T]:
    """Every rank's `value` (picklable), in rank order; `[value]` in one process."""
    dist = _world()
    if dist is None:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def barrier() -> None:
    """Return once every rank has called it (at once in one process)."""
    dist = _world()
    if dist is not None:
        dist.barrier()
