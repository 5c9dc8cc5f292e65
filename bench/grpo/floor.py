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


def floor_seconds(machine: dict, params: int, config: dict = CONFIG, kv_bytes_per_token: int = 0) -> dict:
    """Per optimizer step: decode bytes ÷ HBM bandwidth + 6 · params · tokens ÷ bf16 FLOP/s (no recompute).

    Decode reads the bf16 weights once per token step of a generation; a size with `floor_kv` also counts the KV
    cache each step reads (every sequence's context so far, `kv_bytes_per_token` each), which at 1,024-token
    completions is about a fifth of the decode bytes. The short sizes' floor is the weights alone, as their
    series were measured. Prefill is left out."""
    completions = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    prompt, completion = config.get("prompt_tokens", PROMPT_TOKENS), config["max_completion_length"]
    tokens = completions * (prompt + completion)
    # One generation serves steps_per_generation micro-batches, i.e. several optimizer steps.
    generations_per_step = config["gradient_accumulation_steps"] / config["steps_per_generation"]
    weight_bytes = params * 2 * completion
    kv_bytes = 0
    if config.get("floor_kv"):
        sequences = config["per_device_train_batch_size"] * config["steps_per_generation"]
        # Token step t (0-based) reads the KV of prompt + t tokens of every sequence.
        kv_bytes = sequences * kv_bytes_per_token * (completion * prompt + completion * (completion - 1) // 2)
    decode = (weight_bytes + kv_bytes) * generations_per_step / machine["hbm_bytes_per_s"]
    train = 6 * params * tokens / machine["bf16_flop_per_s"]
    return {
        "decode_s": decode,
        "decode_kv_s": kv_bytes * generations_per_step / machine["hbm_bytes_per_s"],
        "train_s": train,
        "floor_s_per_step": decode + train,
    }
