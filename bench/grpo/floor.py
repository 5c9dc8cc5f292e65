"""The machine's floor for a step: HBM bandwidth and bf16 matmul rate measured on the GPU, and the
seconds a step could take at those rates."""

from __future__ import annotations

import time

from bench.grpo.sizes import CONFIG, PROMPT_TOKENS


def measure_machine() -> dict:
    import torch

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bandwidth = 2 * x.numel() * 10 / (time.perf_counter() - t0)  # read + write
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    flops = 2 * 8192**3 * 20 / (time.perf_counter() - t0)
    return {
        "hbm_bytes_per_s": bandwidth,
        "bf16_flop_per_s": flops,
        "device": torch.cuda.get_device_name(),
        "total_bytes": torch.cuda.get_device_properties(0).total_memory,
    }


def floor_seconds(machine: dict, params: int, config: dict = CONFIG) -> dict:
    """Per optimizer step: decode bytes ÷ HBM bandwidth + 6 · params · tokens ÷ bf16 FLOP/s."""
    completions = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    tokens = completions * (PROMPT_TOKENS + config["max_completion_length"])
    # One generation serves steps_per_generation micro-batches, i.e. several optimizer steps.
    generations_per_step = config["gradient_accumulation_steps"] / config["steps_per_generation"]
    decode_bytes = params * 2 * config["max_completion_length"] * generations_per_step
    decode = decode_bytes / machine["hbm_bytes_per_s"]
    train = 6 * params * tokens / machine["bf16_flop_per_s"]
    return {"decode_s": decode, "train_s": train, "floor_s_per_step": decode + train}
