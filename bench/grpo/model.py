"""The models the bench makes on the machine (no checkpoint of these sizes ships anywhere, and nothing is
downloaded): random-init decoders shaped so that ZeRO-3 training state and vLLM compete for the GPU.

- `large`: Llama-shaped, SmolLM2's tokenizer and vocabulary, tied embeddings (`LARGE_SHAPES`);
- `seed`: Qwen2-architecture (biased q/k/v projections, untied embeddings, Qwen2.5-7B's decoder shape), SmolLM2's
  tokenizer and vocabulary (`SEED_SHAPES`); its `tiny` shape serves CPU dry runs.

Each is kept across calls on the same machine: a marker file in its folder names the shape it holds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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
# Qwen2.5-7B's decoder (hidden 3584, MLP 18944, 28 layers, 28 heads / 4 KV heads, untied embeddings) with
# SmolLM2's vocabulary: 6.88B parameters, whose 16 bytes each of ZeRO-3 state take 102.5 GiB of an H200.
SEED_SHAPES = {
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
    },
    # The same architecture in miniature: CPU dry runs (`--cpu`).
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
DEFAULT_MODEL_DIRS = {"large": "/tmp/models/random-large", "seed": "/tmp/models/random-seed"}
MARKER = "colocgrpo-shape.json"


def shape_params(shape: dict, vocab: int = 49152) -> int:
    """Parameter count of a Llama-shaped decoder with tied embeddings."""
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    return vocab * h + n * per_layer + h


def model_dir(kind: str, cpu: bool = False) -> Path:
    """Where a kind's model is made unless `--model-dir` says otherwise (CPU dry runs: a folder of their own)."""
    return Path(DEFAULT_MODEL_DIRS[kind] + ("-cpu" if cpu else ""))


def qwen2_params(shape: dict, vocab: int = 49152) -> int:
    """Parameter count of a Qwen2-architecture decoder with untied embeddings (an input embedding and an LM
    head of `vocab` rows each; biases on the q, k and v projections)."""
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * i + 2 * h  # q, o; k, v; their biases; MLP; norms
    return 2 * vocab * h + n * per_layer + h


def kv_bytes_per_token(shape: dict, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes in every layer: keys and values of each KV head."""
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * dtype_bytes


def pick_large_shape(device_bytes: int) -> str:
    for name, shape in LARGE_SHAPES.items():  # largest first
        if shape_params(shape) * TRAINING_STATE_BYTES_PER_PARAM <= 0.85 * device_bytes:
            return name
    raise SystemExit(f"no large shape fits {device_bytes / 2**30:.0f} GiB")


def pick_seed_shape(device_bytes: int | None) -> str:
    """The seed size's shape for a card of `device_bytes` (None: a CPU dry run, the tiny shape): the 7B
    decoder where its ZeRO-3 state fits in 85 % of the card, as the large size."""
    if device_bytes is None:
        return "tiny"
    if qwen2_params(SEED_SHAPES["7b"]) * TRAINING_STATE_BYTES_PER_PARAM <= 0.85 * device_bytes:
        return "7b"
    raise SystemExit(f"the seed size's 7B decoder does not fit {device_bytes / 2**30:.0f} GiB")


def seed_config(shape: dict, tokenizer: Any) -> Any:
    """A Qwen2 config of `shape` around `tokenizer`'s vocabulary and special tokens (Qwen2.5's RoPE base and
    norm epsilon, untied embeddings, no sliding window)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        **shape,
        head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def make_model(kind: str, model_dir: Path, tokenizer_from: str, cpu: bool = False) -> dict:
    """The random-init model of `kind` (`large` or `seed`) in `model_dir`, with `tokenizer_from`'s tokenizer,
    shaped for this machine's GPU (`cpu`: the seed size's tiny shape, on the CPU). A folder whose marker names
    the same shape is kept. Returns what the marker records: shape, parameters, KV bytes per token, path."""
    import torch
    import transformers

    marker = model_dir / MARKER
    device_bytes = None if cpu else torch.cuda.get_device_properties(0).total_memory
    if kind == "large":
        if device_bytes is None:
            raise SystemExit("the large model is made on a GPU")
        shape_name = pick_large_shape(device_bytes)
        shape = LARGE_SHAPES[shape_name]
    else:
        shape_name = pick_seed_shape(device_bytes)
        shape = SEED_SHAPES[shape_name]
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("shape") == shape_name and made.get("kind", "large") == kind:
            return made
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_from)
    if kind == "large":
        config = transformers.AutoConfig.from_pretrained(tokenizer_from)
        for key, value in shape.items():
            setattr(config, key, value)
        config.head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    else:
        config = seed_config(shape, tokenizer)
    torch.manual_seed(0)
    with torch.device("cpu" if cpu else "cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32 if cpu else torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="5GB")
    tokenizer.save_pretrained(model_dir)
    info = {
        "kind": kind,
        "architecture": type(model).__name__,
        "shape": shape_name,
        **shape,
        "params": sum(p.numel() for p in model.parameters()),
        "kv_bytes_per_token": kv_bytes_per_token(shape),
        "path": str(model_dir),
        "seconds_to_create": time.perf_counter() - start,
    }
    marker.write_text(json.dumps(info, indent=2))
    return info
