"""Weight-push buckets: consecutive runs of parameters up to a byte budget.

A push gathers each bucket (ZeRO-3: one `GatheredParameters` over the bucket's list, i.e.
one all-gather for many parameters) and hands it to vLLM in one `load_weights` call,
instead of TRL's one gather + one call per parameter. The budget bounds the extra GPU
memory the gathered full tensors take while a bucket is in flight.

Pure Python: sizes come in as numbers so the rules are tested without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024


def plan_buckets(sizes: Sequence[tuple[str, int]], budget_bytes: int) -> list[list[int]]:
    """Split parameters (in their given order) into buckets of indices.

    Every parameter appears in exactly one bucket, order is preserved, and a bucket's total
    stays within `budget_bytes` except a single parameter larger than the budget, which
    gets a bucket of its own (it cannot be split: vLLM loads whole tensors).
    """
    if budget_bytes <= 0:
        raise ValueError(f"bucket budget must be positive, got {budget_bytes} bytes")
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i, (name, nbytes) in enumerate(sizes):
        if nbytes < 0:
            raise ValueError(f"parameter {name!r} has negative size {nbytes}")
        if current and current_bytes + nbytes > budget_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets
