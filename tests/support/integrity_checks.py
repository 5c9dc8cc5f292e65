"""Trainer-side checks of the weight-integrity suite, free of vLLM and CUDA so that they
also run (and are tested) on CPU: prompt tokens, the greedy-consistency margin, and the
trainer's weight versions.

Weight versions: each "optimizer step" of the suite moves the trainer's weights to
    W_v = W_base + SIGMA · std(W_base) · N(0, 1; seed v)        (per tensor)
i.e. independent perturbations around the checkpoint, not cumulative training. Measured
on CPU with SmolLM2-135M-Instruct (fp32, the suite's six prompts, 12 greedy tokens):
cumulative AdamW steps (lr 1e-3) on random text collapse the model within four steps into
emitting ",,,," — after which a step no longer changes greedy outputs (stale margin 1.1
logits) and the stale check loses its power. With SIGMA = 0.1 every version still answers
coherently and the previous version's completions miss the new arg-max by 5.0–12.5 logits
(SIGMA 0.05: 1.8–4.6, too weak).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SIGMA = 0.1


def chat_prompt_ids(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt as a one-turn chat with the generation prompt.

    transformers 5 returns a `BatchEncoding` (a Mapping, not a dict) from
    `apply_chat_template(tokenize=True)`; older versions a plain list.
    """
    out = []
    for text in prompts:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError(f"empty prompt tokens for {text!r}")
        out.append(ids)
    return out


def max_margin(model: Any, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> float:
    """Largest (arg-max logit − chosen-token logit) over all completion tokens, teacher-forced
    through `model`. 0 means every token is the model's greedy choice. An empty completion
    (nothing generated despite ignore_eos) counts as infinitely far from greedy."""
    import torch

    device = next(model.parameters()).device
    worst = 0.0
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            c = [int(t) for t in c]
            if not c:
                return float("inf")
            ids = torch.tensor([list(p) + c], device=device)
            logits = model(ids).logits[0, len(p) - 1 : len(p) - 1 + len(c)].float()
            chosen = logits.gather(1, torch.tensor(c, device=device)[:, None])[:, 0]
            worst = max(worst, float((logits.max(dim=1).values - chosen).max()))
    return worst


class WeightVersions:
    """The trainer's weights as a sequence of versions around the loaded checkpoint.

    `gather(params, modify)` is a context manager that makes partitioned parameters whole (and, with
    `modify`, writes changes back into the partitions): `deepspeed.zero.GatheredParameters` for a
    ZeRO-3 model, nothing (the default) for a plain one."""

    def __init__(self, model: Any, sigma: float = SIGMA, gather: Callable[[list, bool], Any] | None = None) -> None:
        import torch

        self.model = model
        self.sigma = sigma
        self.version = 0
        self.gather = gather or (lambda params, modify: contextlib.nullcontext())
        with torch.no_grad(), self.gather(list(model.parameters()), False):
            self.base = {n: p.detach().clone() for n, p in model.named_parameters()}

    def step(self) -> int:
        """Move every parameter to the next version's weights, in place (the same Parameter
        objects the engine's push reads). Returns the new version."""
        import torch

        self.version += 1
        gen = torch.Generator(device="cpu").manual_seed(1000 + self.version)
        with torch.no_grad(), self.gather(list(self.model.parameters()), True):
            for name, param in self.model.named_parameters():
                base = self.base[name]
                scale = self.sigma * float(base.float().std()) if base.numel() > 1 else 0.0
                noise = torch.randn(base.shape, generator=gen, dtype=torch.float32)
                param.copy_((base.float() + scale * noise.to(base.device)).to(param.dtype))
        return self.version
