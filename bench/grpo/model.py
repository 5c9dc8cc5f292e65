"""The large size's model: a random-init decoder made on the machine (no checkpoint of that size ships
anywhere), shaped so that ZeRO-3 training state and vLLM compete for the GPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.grpo.sizes import TRAINING_STATE_BYTES_PER_PARAM

# Llama-shaped decoders with SmolLM2's vocabulary (49152, tied embeddings). The largest whose
# ZeRO-3 training state (bf16 weights + bf16 grads + fp32 master + two fp32 Adam moments:
# 16 bytes per parameter) fits in 85 % of the card is built, so that vLLM's share is what
# remains: training state and vLLM compete for memory.
LARGE_SHAPES = {
    "7b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
    },
}
DEFAULT_LARGE_MODEL_DIR = "/tmp/models/random-large"


def shape_params(shape: dict, vocab: int = 49152) -> int:
    """Parameter count of a Llama-shaped decoder with tied embeddings."""
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    return vocab * h + n * per_layer + h


def pick_large_shape(device_bytes: int) -> str:
    for name, shape in LARGE_SHAPES.items():  # largest first
        if shape_params(shape) * TRAINING_STATE_BYTES_PER_PARAM <= 0.85 * device_bytes:
            return name
    raise SystemExit(f"no large shape fits {device_bytes / 2**30:.0f} GiB")


def make_large_model(model_dir: Path, tokenizer_from: str) -> dict:
    """Random-init decoder of SmolLM2's family, sized by `pick_large_shape`; kept across
    calls on the same machine (a marker file names its shape)."""
    import torch
    import transformers

    marker = model_dir / "colocgrpo-shape.json"
    shape_name = pick_large_shape(torch.cuda.get_device_properties(0).total_memory)
    if marker.exists() and json.loads(marker.read_text()).get("shape") == shape_name:
        return json.loads(marker.read_text())
    start = time.perf_counter()
    shape = LARGE_SHAPES[shape_name]
    config = transformers.AutoConfig.from_pretrained(tokenizer_from)
    for key, value in shape.items():
        setattr(config, key, value)
    config.head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="5GB")
    transformers.AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(model_dir)
    info = {
        "shape": shape_name,
        **shape,
        "params": sum(p.numel() for p in model.parameters()),
        "path": str(model_dir),
        "seconds_to_create": time.perf_counter() - start,
    }
    marker.write_text(json.dumps(info, indent=2))
    return info
