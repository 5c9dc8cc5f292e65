"""The step shapes every contender of a run shares (`SIZES`, fixed before any run) and the vLLM
utilizations tried at the large size (`util_ladder`: what the training state leaves)."""

from __future__ import annotations

import os

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

# Fixed before the first run (no tuning to the numbers). `small` ran on 2026-12-02
# (commit 09d1197); `large` was fixed on 2026-12-02 before its first run.
SIZES = {
    "small": {
        "prompts_per_step": 16,
        "num_generations": 8,
        "max_completion_length": 64,
        "per_device_train_batch_size": 128,  # the whole step in one micro-batch
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,  # two optimizer steps per generation: the no-push-due cycle exists
        "learning_rate": 1e-6,
        "warmup_steps": 3,
        "measured_steps": 6,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 512,
        "seed": 42,
    },
    "large": {
        "prompts_per_step": 8,
        "num_generations": 8,
        "max_completion_length": 64,
        "per_device_train_batch_size": 16,  # 64 completions per optimizer step in 4 micro-batches
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 8,  # micro-batches per generation: one generation per two optimizer steps
        "learning_rate": 1e-6,
        "warmup_steps": 2,
        "measured_steps": 6,
        "gpu_memory_utilization": None,  # per contender, from --util-ladder
        "max_model_len": 512,
        "seed": 42,
    },
    # CPU dry runs of the plumbing only (the vLLM stand-in recomputes every token): never a measurement.
    "cpu": {
        "prompts_per_step": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 2,
        "learning_rate": 1e-6,
        "warmup_steps": 1,
        "measured_steps": 1,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 256,
        "seed": 42,
    },
}
CONFIG = SIZES["small"]
PROMPT_TOKENS = 40  # chat-formatted "What is a + b? Explain." for SmolLM2's template
# ZeRO-3 training state: bf16 weights + bf16 grads + fp32 master + two fp32 Adam moments.
TRAINING_STATE_BYTES_PER_PARAM = 16
UTIL_RESERVE_BYTES = 8 * 2**30  # activations, ZeRO-3 buckets, CUDA context, vLLM's graph pool
UTIL_STEP = 0.03


def util_ladder(device_bytes: int, params: int, tries: int = 3) -> list[float]:
    """vLLM utilizations to try at the large size, highest first: the memory plan's
    estimate (what training state and a fixed reserve leave), then `UTIL_STEP` lower."""
    planned = (device_bytes - params * TRAINING_STATE_BYTES_PER_PARAM - UTIL_RESERVE_BYTES) / device_bytes
    top = int(planned * 100) / 100
    return [round(top - k * UTIL_STEP, 2) for k in range(tries) if top - k * UTIL_STEP >= 0.05]
