"""The step shapes every contender of a run shares (`SIZES`, fixed before any run) and the vLLM
utilizations tried where the size sets none (`util_ladder`: what the training state leaves)."""

from __future__ import annotations

import os

MODEL = os.environ.get("COLOCGRPO_TEST_MODEL", "/tmp/models/smollm2-135m-instruct")

# Fixed before the first run of each (no tuning to the numbers). `prompt_tokens`: the prompts' length in
# tokens as the chat template renders them; `exact_prompts` pads every prompt to exactly that many;
# `full_length`: vLLM ignores the end-of-sequence token, so every completion is max_completion_length long;
# `model`: the random-init model the bench makes for the size (`large` or `seed`, bench/grpo/model.py);
# `floor_kv`: the floor counts the KV cache's reads (bench/grpo/floor.py).
SIZES: dict[str, dict] = {
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
        "prompt_tokens": 40,
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
        "prompt_tokens": 40,
        "model": "large",
    },
    # The seed recipe's shape (tests/data/seed-config.yaml) on one GPU: 512-token prompts, 1,024-token
    # completions, 16 generations, 16 x 4 micro-batches with one generation per optimizer step, on a
    # random-init Qwen2-architecture decoder of about 7B. A random model never stops early; with
    # `full_length` no completion can, so every step decodes the same 64 x 1,024 tokens.
    "seed": {
        "prompts_per_step": 4,
        "num_generations": 16,
        "max_completion_length": 1024,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 4,
        "learning_rate": 1e-6,
        "temperature": 0.7,
        "warmup_steps": 1,
        "measured_steps": 3,
        "gpu_memory_utilization": None,  # per contender: ours from the memory plan, TRL from the ladder
        "max_model_len": 1536,
        "seed": 42,
        "prompt_tokens": 512,
        "exact_prompts": True,
        "full_length": True,
        "model": "seed",
        "floor_kv": True,
        "contender_timeout_s": 330,
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
        "prompt_tokens": 40,
    },
    # `seed` in miniature for CPU dry runs (--cpu): the same code paths (a Qwen2 model made by the bench, exact
    # prompts, full-length completions, a merge the memory plan may choose), a tiny shape.
    "seed-cpu": {
        "prompts_per_step": 2,
        "num_generations": 4,
        "max_completion_length": 8,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 2,
        "learning_rate": 1e-6,
        "temperature": 0.7,
        "warmup_steps": 1,
        "measured_steps": 1,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 64,
        "seed": 42,
        "prompt_tokens": 48,
        "exact_prompts": True,
        "full_length": True,
        "model": "seed",
        "floor_kv": True,
    },
}
CONFIG = SIZES["small"]
PROMPT_TOKENS = 40  # chat-formatted "What is a + b? Explain." for SmolLM2's template
CONTENDER_TIMEOUT_S = 200.0  # a size's `contender_timeout_s`, where it sets none
# ZeRO-3 training state: bf16 weights + bf16 grads + fp32 master + two fp32 Adam moments.
TRAINING_STATE_BYTES_PER_PARAM = 16
UTIL_RESERVE_BYTES = 8 * 2**30  # activations, ZeRO-3 buckets, CUDA context, vLLM's graph pool
UTIL_STEP = 0.03


def util_ladder(device_bytes: int, params: int, tries: int = 3) -> list[float]:
    """vLLM utilizations to try, highest first: what the training state and a fixed reserve leave (the
    highest that fits beside a trainer state kept on the GPU while vLLM generates), then `UTIL_STEP` lower."""
    planned = (device_bytes - params * TRAINING_STATE_BYTES_PER_PARAM - UTIL_RESERVE_BYTES) / device_bytes
    top = int(planned * 100) / 100
    return [round(top - k * UTIL_STEP, 2) for k in range(tries) if top - k * UTIL_STEP >= 0.05]
