"""A tiny random chat model built offline, for CPU tests and the local demo.

`build_tiny_model(path)` writes a Hugging Face model folder (config, safetensors weights,
tokenizer with a ChatML chat template) that `AutoModelForCausalLM` / `AutoTokenizer` load
like any hub model — no download. The weights are random (seeded), so completions are
noise; that is all a test of the plumbing needs.

    python -m colocgrpo_dev.models.tiny PATH
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<|pad|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Text the byte-level BPE learns its merges from: the words our tests and demo prompts use.
_CORPUS = [
    "What is 2 + 3? Answer with a number.",
    "What is 7 + 5? Think step by step.",
    "You are a helpful assistant. Reason in <think> tags and answer in <answer> tags.",
    "<think>\nadd the numbers\n</think>\n<answer>\n5\n</answer>",
    "system user assistant The answer is \\boxed{12} because 7 plus 5 is 12.",
    "Compute the sum of 1, 2, 3 and 4. Solve for x: 2x = 10.",
]
TINY_VOCAB_SIZE = 384


def build_tiny_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic), saved to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(str(path))
    return wrapped


def build_tiny_model(path: str | Path, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Write a tiny Qwen2-architecture model + tokenizer to `path` (created) and return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(path)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.save_pretrained(str(path))
    (path / "colocgrpo-tiny.json").write_text(
        json.dumps({"built_by": "colocgrpo_dev.models.tiny", "hidden_size": hidden_size, "layers": num_layers})
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m colocgrpo_dev.models.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="folder to write the model into (created)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    out = build_tiny_model(args.path, hidden_size=args.hidden_size, num_layers=args.layers)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
