"""What the bench reads off a trainer's vLLM engine, the same way for TRL's and ours (both keep it at
`trainer.vllm_generation.llm`): every generate call's lengths and seconds, the requests vLLM preempted, and the
KV cache's capacity in tokens.

vLLM's own counters are off in a colocated engine (`LLM` runs without stats logging), so preemptions are counted
where they happen: the V1 scheduler's `_preempt_request`, in this process (a colocated engine runs its engine core
in-process). Where an engine has no such scheduler (another vLLM version, the CPU stand-in) the count is None, not
0; so is the KV capacity where the engine's cache config has no block count. The parent also reads the capacity
from vLLM's log line (`logged_kv_cache_tokens`)."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

KV_CACHE_LOG = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


class GenerateRecorder:
    """Wraps `llm.generate`: per call, its seconds, the number of sequences, and their prompt and completion
    lengths in tokens."""

    def __init__(self, llm: Any) -> None:
        self.calls: list[dict] = []
        generate = llm.generate

        def recorded(prompts: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            outputs = generate(prompts, *args, **kwargs)
            seconds = time.perf_counter() - start
            prompt_lengths = [len(p["prompt_token_ids"]) for p in prompts if isinstance(p, dict)]
            completion_lengths = [len(c.token_ids) for o in outputs for c in o.outputs]
            self.calls.append(
                {
                    "seconds": seconds,
                    "sequences": len(completion_lengths),
                    "prompt_tokens": [min(prompt_lengths), max(prompt_lengths)] if prompt_lengths else None,
                    "completion_tokens": [min(completion_lengths), max(completion_lengths)]
                    if completion_lengths
                    else None,
                    "completion_tokens_mean": statistics.mean(completion_lengths) if completion_lengths else None,
                }
            )
            return outputs

        llm.generate = recorded

    def summary(self, skip: int = 0) -> dict:
        """The calls after the first `skip` (the warm-up's): median seconds per call, and the lengths seen in
        every call."""
        calls = self.calls[skip:] or self.calls
        if not calls:
            return {"generate_calls": 0}
        prompts = [c["prompt_tokens"] for c in calls if c["prompt_tokens"]]
        completions = [c["completion_tokens"] for c in calls if c["completion_tokens"]]
        return {
            "generate_calls": len(self.calls),
            "generate_s_median": statistics.median(c["seconds"] for c in calls),
            "sequences_per_generate": max(c["sequences"] for c in calls),
            "prompt_tokens_range": [min(p[0] for p in prompts), max(p[1] for p in prompts)] if prompts else None,
            "completion_tokens_range": (
                [min(c[0] for c in completions), max(c[1] for c in completions)] if completions else None
            ),
        }


def in_process_scheduler(llm: Any) -> Any:
    """vLLM V1's scheduler of a colocated engine (LLM → LLMEngine → in-process client → EngineCore), or None."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    return getattr(getattr(client, "engine_core", None), "scheduler", None)


class PreemptionCounter:
    """Counts the requests vLLM preempts (freed KV cache, recomputed later). `count` is None where the engine has
    no V1 scheduler with `_preempt_request` in this process."""

    def __init__(self, llm: Any) -> None:
        self.count: int | None = None
        scheduler = in_process_scheduler(llm)
        preempt = getattr(scheduler, "_preempt_request", None)
        if preempt is None:
            return
        self.count = 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count = (self.count or 0) + 1
            return preempt(*args, **kwargs)

        scheduler._preempt_request = counted


def kv_cache_tokens(llm: Any) -> int | None:
    """Tokens the engine's KV cache holds: its GPU blocks times the block size, from the config the engine core
    filled in when it sized the cache; None where that is not readable."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    if isinstance(blocks, int) and isinstance(block_size, int):
        return blocks * block_size
    return None


def logged_kv_cache_tokens(work: Path) -> int | None:
    """The KV cache size vLLM logged in a contender's output (the last such line), or None."""
    found = None
    for name in ("stdout.log", "stderr.log"):
        path = work / name
        if path.exists():
            for match in KV_CACHE_LOG.finditer(path.read_text(errors="replace")):
                found = int(match.group(1).replace(",", ""))
    return found
