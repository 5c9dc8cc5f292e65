"""The contenders' dataset: conversational prompts "What is a + b? Explain.", as TRL's chat template renders
them, and for a size with `exact_prompts` every prompt padded with filler words to exactly its `prompt_tokens`."""

from __future__ import annotations

from typing import Any

# Appended one at a time to reach an exact length; the first that adds tokens without passing the target wins.
# Several, because a tokenizer may merge a unit with the text before it (adding nothing) or split it in two.
FILLER = (" x", " a", " 1", ".", "x", "!", " ")
BULK = " x"  # repeated to come within a few tokens of the target first


def question_rows(count: int | None = None) -> list[dict]:
    """The questions "What is a + b? Explain." for a, b in 1..29 (the first `count` of them)."""
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Explain."}]}
        for a in range(1, 30)
        for b in range(1, 30)
    ]
    return rows if count is None else rows[:count]


def prompt_length(tokenizer: Any, content: str) -> int:
    """Tokens of a one-message user prompt as TRL 1.16's GRPOTrainer tokenizes it for generation
    (`_tokenize_prompts`: the chat template with the generation prompt, tokenized in one call)."""
    tokenized = tokenizer.apply_chat_template(
        conversation=[[{"role": "user", "content": content}]],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )
    return len(tokenized["input_ids"][0])


def padded_content(tokenizer: Any, content: str, tokens: int) -> str:
    """`content` with filler appended so that its prompt is exactly `tokens` long.

    Raises:
        ValueError: the prompt is longer than `tokens` already, or no filler reaches the exact count.
    """
    length = prompt_length(tokenizer, content)
    if length > tokens:
        raise ValueError(f"the prompt {content!r} takes {length} tokens, more than {tokens}")
    # The most repetitions of BULK that stay at least a few tokens short (the length grows with them).
    low, high = 0, tokens
    while low < high:
        middle = (low + high + 1) // 2
        if prompt_length(tokenizer, content + BULK * middle) <= tokens - 4:
            low = middle
        else:
            high = middle - 1
    text = content + BULK * low
    length = prompt_length(tokenizer, text)
    while length < tokens:
        for unit in FILLER:
            longer = prompt_length(tokenizer, text + unit)
            if length < longer <= tokens:
                text, length = text + unit, longer
                break
        else:
            raise ValueError(f"no filler brings the prompt from {length} to exactly {tokens} tokens")
    return text


def exact_rows(tokenizer: Any, tokens: int, count: int) -> list[dict]:
    """`count` question rows, each padded to a prompt of exactly `tokens` tokens."""
    return [
        {"prompt": [{"role": "user", "content": padded_content(tokenizer, row["prompt"][0]["content"], tokens)}]}
        for row in question_rows(count)
    ]


def generation_batch(tokenizer: Any, rows: list[dict], config: dict) -> list[list[int]]:
    """One generation batch as a training run at `config` (a size of `bench/grpo/sizes.py`) makes it:
    per_device_train_batch_size x steps_per_generation sequences, the first rows' prompts rendered by the chat
    template with the generation prompt and tokenized, each `num_generations` times in a row, as TRL repeats them."""
    sequences = config["per_device_train_batch_size"] * config["steps_per_generation"]
    prompts = []
    for row in rows[: sequences // config["num_generations"]]:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [p for p in prompts for _ in range(config["num_generations"])]
