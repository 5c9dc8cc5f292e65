"""Measure what the planner estimates, on a real GPU: total memory, CUDA context, activation peaks.

Runs with only torch + transformers (no network: models are built from their shapes with random weights).
For each shape in the planner's table and each (batch, seq, checkpointed layers: all, the first half, none) case
it measures the peak memory
of one forward + backward of the decoder backbone beyond its parameters and gradients, and prints it next to
`colocgrpo_training.planner.formulas.activation_bytes`. Usage (GPU machine, repository root):

    PYTHONPATH=training python3 bench/planner/calibrate_activations.py [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from colocgrpo_training.generation.checkpointing import checkpoint_first_layers
from colocgrpo_training.planner import BUILTIN_SHAPES, ModelShape
from colocgrpo_training.planner import formulas as f

GIB = 1024**3


def build(key: str) -> torch.nn.Module:
    s = ModelShape(**BUILTIN_SHAPES[key])
    common = dict(
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        intermediate_size=s.intermediate_size,
        vocab_size=s.vocab_size,
        tie_word_embeddings=s.tie_word_embeddings,
        max_position_embeddings=s.max_position_embeddings or 4096,
    )
    if key.startswith("qwen"):
        config = Qwen2Config(**common)
        cls = Qwen2ForCausalLM
    else:
        config = LlamaConfig(**common, head_dim=s.head_size)
        cls = LlamaForCausalLM
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = cls(config).to(torch.bfloat16)
    return model


def measure(model: torch.nn.Module, batch: int, seq: int, checkpointed: int) -> int:
    """The activation peak with the first `checkpointed` decoder layers checkpointed (the trainer's pattern:
    colocgrpo_training.generation.checkpointing.PartialRecompute)."""
    model.gradient_checkpointing_disable()
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        checkpoint_first_layers(model, checkpointed)
    model.train()
    model.zero_grad(set_to_none=True)
    # one warm-up step so parameter gradients exist and cuBLAS workspaces are allocated
    for _step in range(2):
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        hidden.float().square().mean().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del hidden, ids
    return peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    result = {
        "device": props.name,
        "total_memory_bytes": props.total_memory,
        "total_memory_gib": props.total_memory / GIB,
        "nvidia_smi": smi,
        "context_used_mib_after_init": smi,
        "cases": [],
    }
    cases = [
        ("smollm2-135m", 8, 1024),
        ("smollm2-135m", 16, 2048),
        ("qwen2.5-0.5b", 8, 1024),
        ("qwen2.5-1.5b", 8, 1536),
        ("llama-3.2-1b", 4, 2048),
    ]
    for key, batch, seq in cases:
        model = build(key)
        shape = ModelShape(**BUILTIN_SHAPES[key])
        for checkpointed in (shape.num_layers, shape.num_layers // 2, 0):
            measured = measure(model, batch, seq, checkpointed)
            estimate = f.activation_bytes(shape, batch * seq, 2, checkpointed)
            row = {
                "model": key,
                "batch": batch,
                "seq": seq,
                "checkpointed_layers": checkpointed,
                "layers": shape.num_layers,
                "measured_gib": measured / GIB,
                "estimate_gib": estimate / GIB,
                "ratio_estimate_over_measured": estimate / measured,
            }
            result["cases"].append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
