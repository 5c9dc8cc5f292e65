"""Small Llama models for the tests: a real transformers model to train or push, and a
config.json for the planner to read. torch and transformers are imported only when a model
is built, so the planner tests (dev venv) can use the config half."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# hidden 256, 4 layers, 8 heads over 2 KV heads (head_dim 32, K/V 64 wide), MLP 512, vocabulary 1000.
SMALL_LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
}


def write_llama_config(folder: Path, **fields: Any) -> Path:
    """Write `SMALL_LLAMA_CONFIG` with `fields` on top as `folder/config.json`; returns its path."""
    path = folder / "config.json"
    path.write_text(json.dumps({**SMALL_LLAMA_CONFIG, **fields}))
    return path


def tiny_llama(seed: int, **config: Any) -> Any:
    """A seeded LlamaForCausalLM of a few thousand parameters: 2 layers, hidden 32, 4 heads over
    2 KV heads, tied embeddings, vocabulary 64. `config` overrides LlamaConfig fields."""
    import torch
    import transformers

    torch.manual_seed(seed)
    settings: dict[str, Any] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        **config,
    }
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings))
