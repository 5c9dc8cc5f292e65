"""Decoder shapes the planner needs, found offline.

Three sources, in order of trust: the model's own `config.json` (a local directory), a built-in table of
common families, or the spec's `parameterCount` (a shape borrowed from the nearest known model with its layer
count scaled to match — marked approximate). No network, no transformers import.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class PlanInputError(ValueError):
    """Bad or insufficient input for the planner; `field` is the spec path to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder: RMSNorm, GQA attention with RoPE, SwiGLU MLP."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None  # None: hidden_size // num_heads
    qkv_bias: bool = False  # Qwen2 has q/k/v biases, Llama does not
    # vLLM's default max_model_len when the spec sets none (config.json max_position_embeddings).
    max_position_embeddings: int | None = None
    source: str = ""  # where the numbers came from, shown in the plan
    approximate: bool = False

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size

    def layer_parameters(self) -> int:
        h = self.hidden_size
        bias = (self.q_size + 2 * self.kv_size) if self.qkv_bias else 0
        attention = h * self.q_size + 2 * h * self.kv_size + self.q_size * h + bias
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        norms = 2 * h
        return attention + mlp + norms

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def parameter_count(self) -> int:
        """Unique parameters (a tied LM head counts once, as DeepSpeed's model_to_params does)."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_parameters()
        final_norm = self.hidden_size
        return self.num_layers * self.layer_parameters() + self.embedding_parameters() + lm_head + final_norm

    def largest_layer_parameters(self) -> int:
        """Parameters of the largest single module, as DeepSpeed's `model_to_params` counts them
        (`module.parameters(recurse=False)`): the embedding for every model in the table."""
        return max(
            self.embedding_parameters(),
            self.hidden_size * self.intermediate_size,
            self.hidden_size * self.q_size,
        )


# Numbers from each model's config.json on the Hugging Face Hub (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings, head_dim):
#   Qwen2.5-0.5B  https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
#   Qwen2.5-1.5B  https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json
#   Qwen2.5-3B    https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json
#   Qwen2.5-7B    https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
#   Qwen2.5-14B   https://huggingface.co/Qwen/Qwen2.5-14B-Instruct/blob/main/config.json
#   Qwen2.5-32B   https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json
#   Qwen2.5-72B   https://huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/config.json
#   Llama-3.2-1B  https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (head_dim 64)
#   Llama-3.2-3B  https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json (head_dim 128)
#   Llama-3.1-8B  https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
#   Llama-3.1/3.3-70B https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json
#   SmolLM2-135M  https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json
#   SmolLM2-360M  https://huggingface.co/HuggingFaceTB/SmolLM2-360M/blob/main/config.json
#   SmolLM2-1.7B  https://huggingface.co/HuggingFaceTB/SmolLM2-1.7B-Instruct/blob/main/config.json
# (read through mirrors of those files; Qwen2.5 instruct and base variants share their shapes except that
# the 7B/14B/32B/72B vocab is 152064 and the small ones 151936.)
def _qwen25(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool) -> dict[str, Any]:
    # max_position_embeddings: 32768 in the Instruct configs (some base configs say 131072).
    return dict(
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        qkv_bias=True,
        max_position_embeddings=32768,
    )


def _llama(
    h: int,
    layers: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    tied: bool,
    head_dim: int | None = None,
    context: int = 131072,
) -> dict[str, Any]:
    return dict(
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        head_dim=head_dim,
        qkv_bias=False,
        max_position_embeddings=context,
    )


_LLAMA_70B = _llama(8192, 80, 64, 8, 28672, 128256, False)
_LLAMA_8B = _llama(4096, 32, 32, 8, 14336, 128256, False)
_LLAMA_3_8K = dict(max_position_embeddings=8192)  # Llama 3.0 (not 3.1+) has an 8k context

# Keys are lower-case name stems; a model name matches when its normalized basename starts with the key
# followed by the end or a "-" (so "Qwen2.5-14B-Instruct" matches "qwen2.5-14b", "Qwen2.5-1.5B" does not).
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen25(896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": _qwen25(1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-3b": _qwen25(2048, 36, 16, 2, 11008, 151936, True),
    "qwen2.5-7b": _qwen25(3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": _qwen25(5120, 48, 40, 8, 13824, 152064, False),
    "qwen2.5-32b": _qwen25(5120, 64, 40, 8, 27648, 152064, False),
    "qwen2.5-72b": _qwen25(8192, 80, 64, 8, 29568, 152064, False),
    "llama-3.2-1b": _llama(2048, 16, 32, 8, 8192, 128256, True, head_dim=64),
    "llama-3.2-3b": _llama(3072, 28, 24, 8, 8192, 128256, True, head_dim=128),
    "llama-3.1-8b": _LLAMA_8B,
    "llama-3-8b": {**_LLAMA_8B, **_LLAMA_3_8K},
    "llama-3.1-70b": _LLAMA_70B,
    "llama-3.3-70b": _LLAMA_70B,
    "llama-3-70b": {**_LLAMA_70B, **_LLAMA_3_8K},
    "smollm2-135m": _llama(576, 30, 9, 3, 1536, 49152, True, head_dim=64, context=8192),
    "smollm2-360m": _llama(960, 32, 15, 5, 2560, 49152, True, head_dim=64, context=8192),
    "smollm2-1.7b": _llama(2048, 24, 32, 32, 8192, 49152, True, head_dim=64, context=8192),
}

KNOWN_FAMILIES = "Qwen2.5 0.5B-72B, Llama 3.x 1B/3B/8B/70B, SmolLM2 135M/360M/1.7B"


def normalize_model_name(name_or_path: str) -> str:
    base = name_or_path.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"^meta-", "", base)


def builtin_shape(name_or_path: str) -> ModelShape | None:
    name = normalize_model_name(name_or_path)
    # Longest key first so "llama-3.1-70b" is never shadowed by a shorter stem.
    for key in sorted(BUILTIN_SHAPES, key=len, reverse=True):
        if name == key or name.startswith(key + "-"):
            return ModelShape(**BUILTIN_SHAPES[key], source=f"built-in table ({key})")
    return None


def shape_from_config(config_path: Path) -> ModelShape:
    """Read a Hugging Face config.json (a multimodal config's `text_config` is used when present)."""
    field = "spec.model.nameOrPath"
    try:
        data = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanInputError(field, f"cannot read {config_path}: {exc}") from None
    if not isinstance(data, dict):
        raise PlanInputError(field, f"{config_path} is not a JSON object")
    return shape_from_mapping(data, f"config.json ({config_path})")


def shape_from_mapping(data: Mapping[str, Any], source: str) -> ModelShape:
    """A Hugging Face model config as a dict (config.json's content, or `PretrainedConfig.to_dict()`); `source`
    names it in the plan and in errors."""
    field = "spec.model.nameOrPath"
    text_config = data.get("text_config")
    text: Mapping[str, Any] = text_config if isinstance(text_config, dict) else data
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in required if not isinstance(text.get(key), int)]
    if missing:
        raise PlanInputError(field, f"{source} lacks integer {', '.join(missing)}; cannot derive the shape")
    model_type = str(text.get("model_type", data.get("model_type", "")))
    qkv_bias = bool(text.get("attention_bias", model_type.startswith("qwen2")))
    return ModelShape(
        hidden_size=text["hidden_size"],
        num_layers=text["num_hidden_layers"],
        num_heads=text["num_attention_heads"],
        num_kv_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
        intermediate_size=text["intermediate_size"],
        vocab_size=text["vocab_size"],
        tie_word_embeddings=bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        head_dim=text.get("head_dim") if isinstance(text.get("head_dim"), int) else None,
        qkv_bias=qkv_bias,
        max_position_embeddings=(
            text["max_position_embeddings"] if isinstance(text.get("max_position_embeddings"), int) else None
        ),
        source=source,
    )


def parse_parameter_count(value: Any) -> int:
    """Accept 14770000000, 1.4e10, "14.7B", "135M"."""
    field = "spec.model.parameterCount"
    if isinstance(value, bool):
        raise PlanInputError(field, f"expected a number of parameters, got {value!r}")
    if isinstance(value, (int, float)):
        count = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMbBtT]?)\s*", value)
        if not match:
            raise PlanInputError(field, f"expected a number such as 14.7e9 or '14.7B', got {value!r}")
        scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
        count = float(match.group(1)) * scale
    else:
        raise PlanInputError(field, f"expected a number of parameters, got {value!r}")
    if count < 1e6:
        raise PlanInputError(field, f"{value!r} is fewer than a million parameters; give the full count (e.g. 7.6e9)")
    return int(count)


def approximate_shape(parameter_count: int) -> ModelShape:
    """Borrow the nearest built-in shape and scale its layer count so the total matches.

    Width, vocabulary and attention layout keep the borrowed model's values; only depth changes. Good
    enough for model states (they depend on the count alone) and within a small factor for activations
    and KV cache, which is why the plan says "approximate".
    """
    candidates = {key: ModelShape(**spec) for key, spec in BUILTIN_SHAPES.items()}
    key, nearest = min(candidates.items(), key=lambda item: abs(item[1].parameter_count() - parameter_count))
    fixed = nearest.parameter_count() - nearest.num_layers * nearest.layer_parameters()
    layers = max(1, round((parameter_count - fixed) / nearest.layer_parameters()))
    return dataclasses.replace(
        nearest,
        num_layers=layers,
        source=f"parameterCount {parameter_count / 1e9:.2f}B with the shape of {key} scaled to {layers} layers",
        approximate=True,
    )
