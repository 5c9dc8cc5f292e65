"""The trainer's log-probs through TRL 1.16's fused, chunked LM head against whole materialized logits, per loss type,
in one process of a gloo world (`support.gloo_world.run_world`; spawned processes import this module by name).

Each rank builds a `ColocGRPOTrainer` (CPU, float32) for every loss type TRL 1.16 accepts and scores micro-batches
of its own shape — its own prompt and completion lengths, padding and tokens — two ways:
- **fused**: as the trainer ships. TRL's `add_fused_lm_head` scores the completion positions in tiles
  (`trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE` tokens x `trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE`
  vocabulary columns); the tiles are shrunk here (`TOKEN_TILE`, `VOCAB_TILE`) so that the tiny model's vocabulary
  and micro-batch span several of each, as a 7B model's 49k-152k vocabulary and 32k-token micro-batches do;
- **materialized**: `model(...).logits` over the completion, `log_softmax`, `gather` and the entropy from the whole
  `[rows, completion, vocab]` tensor — what a trainer without a fused head computes.

Two cases per loss type: `deferred`, the old log-probs and vLLM's importance-sampling correction taken from the
loss's own forward (`ColocGRPOTrainer`'s deferral, its state set as `_finish_old_logps` sets it), the correction's
metrics gathered across ranks; `given`, old and reference log-probs (beta > 0) and a correction that differ from the
policy's, so that the clipping, KL and correction terms are active. Plus the no-grad forwards of the old and the
reference log-probs, several rows per forward. Every rank writes `rank<R>.json`: per loss type and case, the
largest difference between the two ways in the loss, every gradient and every logged metric, the metrics
themselves, and how many logit rows over the whole vocabulary existed at once on each way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Every loss type of TRL 1.16's GRPOConfig (`_compute_loss`).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
TOKEN_TILE, VOCAB_TILE = 16, 100
ROWS = 8
TEMPERATURE = 0.7
BETA = 0.04
ACCUMULATION, STEPS_PER_GENERATION = 2, 2


def _join(rank: int, world: int, port: int) -> None:
    # accelerate starts the process group from these when GRPOConfig is built (ddp_backend gloo).
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )


def materialized_logps_and_entropies(
    self: Any,
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    **_: Any,
) -> tuple[Any, Any, Any]:
    """GRPOTrainer._get_per_token_logps_and_entropies with whole logits: zero where the position is padding, as
    TRL's fused head returns (its labels are -100 there)."""
    import torch

    batch_size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False).logits
        logprobs = (logits[:, :-1].float() / self.temperature).log_softmax(-1)
        padding = mask[:, -logits_to_keep:] == 0
        targets = ids[:, -logits_to_keep:]
        logps.append(logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).masked_fill(padding, 0.0))
        entropies.append((-(logprobs.exp() * logprobs).sum(-1)).masked_fill(padding, 0.0))
    return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None


class VocabRows:
    """Dispatch mode: the most logit rows over the whole vocabulary that one tensor held (outputs whose last
    dimension is the vocabulary), across the forward and the backward run under it."""

    def __init__(self, vocab: int) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for leaf in tree_leaves(out):
                    shape = getattr(leaf, "shape", ())
                    if len(shape) >= 2 and shape[-1] == vocab:
                        tracker.rows = max(tracker.rows, leaf.numel() // vocab)
                return out

        self.rows = 0
        self.mode = _Mode()


def _batch(rank: int, vocab: int, pad: int) -> dict[str, Any]:
    """This rank's micro-batch: left-padded prompts and right-padded completions of lengths of its own."""
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    prompt_len, completion_len = 5 + 3 * rank, 9 + 5 * rank
    prompt = torch.randint(3, vocab, (ROWS, prompt_len), generator=g)
    completion = torch.randint(3, vocab, (ROWS, completion_len), generator=g)
    prompt_mask = torch.ones_like(prompt)
    completion_mask = torch.ones_like(completion)
    for row in range(ROWS):
        prompt_mask[row, : row % 3] = 0
        completion_mask[row, completion_len - (row * 2) % completion_len :] = 0 if row else 1
    completion_mask[0] = 1  # one full-length row
    completion_mask[-1, 1:] = 0  # one single-token completion
    prompt = prompt.masked_fill(prompt_mask == 0, pad)
    completion = completion.masked_fill(completion_mask == 0, pad)
    return {
        "prompt_ids": prompt,
        "prompt_mask": prompt_mask,
        "completion_ids": completion,
        "completion_mask": completion_mask,
        "advantages": torch.randn(ROWS, generator=g),
    }


def _trainer(model_dir: str, out: Path, loss_type: str) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer
    from support.cpu_trainer import length_reward

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}]} for i in range(ROWS)]
    args = GRPOConfig(
        output_dir=str(out / loss_type),
        report_to=[],
        use_cpu=True,
        bf16=False,
        ddp_backend="gloo",
        save_strategy="no",
        disable_tqdm=True,
        per_device_train_batch_size=ROWS,
        num_generations=ROWS,
        gradient_accumulation_steps=ACCUMULATION,
        steps_per_generation=STEPS_PER_GENERATION,
        max_completion_length=40,
        temperature=TEMPERATURE,
        beta=BETA,
        loss_type=loss_type,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token",
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
        epsilon_high=0.28,
    )
    trainer = ColocGRPOTrainer(
        model=model_dir,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        generation_settings=VLLMSettings(enabled=False),
    )
    # What the colocated path and the training loop set: the correction on, the accumulation window's size.
    trainer.use_vllm = True
    trainer.current_gradient_accumulation_steps = ACCUMULATION
    trainer.model.train()
    return trainer


def _score(trainer: Any, inputs: dict[str, Any], deferred: bool, vocab: int) -> dict[str, Any]:
    """One loss forward and backward as `_compute_loss` runs it: the loss, gradients, logged metrics."""
    from colocgrpo_training.generation.old_logps import SamplingStats

    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    inputs = dict(inputs)
    if deferred:  # as _finish_old_logps leaves a micro-batch trained before the next optimizer step
        trainer._deferred_chunks = [inputs]
        trainer._sampling_stats = SamplingStats(trainer.vllm_importance_sampling_mode)
    rows = VocabRows(vocab)
    with rows.mode:
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
    assert not deferred or (not trainer._deferred_chunks and trainer._sampling_stats is None), "not scored as deferred"
    return {
        "loss": loss.detach(),
        "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
        "metrics": {k: v[-1] for k, v in trainer._metrics["train"].items()},
        "ratio": inputs["importance_sampling_ratio"].detach(),
        "vocab_rows": rows.rows,
    }


def _no_grad(trainer: Any, inputs: dict[str, Any], vocab: int) -> dict[str, Any]:
    """The old and the reference log-probs' no-grad forwards (four rows per forward at most; the trainer may
    take more, the same on every rank)."""
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    rows = VocabRows(vocab)
    with torch.no_grad(), rows.mode:
        old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
        ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, keep, batch_size=4)
    return {"old": old, "ref": ref, "vocab_rows": rows.rows}


def _difference(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    def largest(x: Any, y: Any) -> float:
        return float((x - y).abs().max())

    assert a["grads"].keys() == b["grads"].keys() and a["metrics"].keys() == b["metrics"].keys()
    return {
        "loss": largest(a["loss"], b["loss"]),
        "grad": max(largest(a["grads"][n], b["grads"][n]) for n in a["grads"]),
        "grad_norm": float(sum(g.pow(2).sum() for g in b["grads"].values()) ** 0.5),
        "ratio": largest(a["ratio"], b["ratio"]),
        "metrics": {k: abs(a["metrics"][k] - b["metrics"][k]) for k in a["metrics"]},
        "fused_metrics": a["metrics"],
        "vocab_rows": {"fused": a["vocab_rows"], "materialized": b["vocab_rows"]},
    }


def compare_heads(
    rank: int, world: int, port: int, model_dir: str, out: str, loss_types: tuple[str, ...] = LOSS_TYPES
) -> None:
    """The worker: writes `<out>/rank<R>.json` (see the module's docstring) for `loss_types`."""
    from unittest import mock

    import torch
    import torch.distributed as dist
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils
    from trl import GRPOTrainer

    _join(rank, world, port)
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    head = "_get_per_token_logps_and_entropies"
    materialized = mock.patch.object(GRPOTrainer, head, materialized_logps_and_entropies)
    with (
        mock.patch.object(chunked, "TOKEN_CHUNK_SIZE", TOKEN_TILE),
        mock.patch.object(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", VOCAB_TILE),
    ):
        for loss_type in loss_types:
            trainer = _trainer(model_dir, Path(out), loss_type)
            vocab = trainer.model.config.vocab_size
            inputs = _batch(rank, vocab, trainer.model.config.pad_token_id)
            tokens = inputs["completion_mask"].sum().float()
            if dist.is_initialized():
                dist.all_reduce(tokens)  # the generation batch's completion tokens, as TRL gathers them
            inputs["num_items_in_batch"] = tokens * STEPS_PER_GENERATION / ACCUMULATION
            forwards = {"fused": _no_grad(trainer, inputs, vocab)}
            with materialized:
                forwards["materialized"] = _no_grad(trainer, inputs, vocab)
            current = forwards["fused"]["old"]
            g = torch.Generator().manual_seed(7 + rank)
            shift = (torch.rand(current.shape, generator=g) - 0.5) * 0.8  # +-0.4: beyond the clip range
            sampling = current + torch.tensor([0.0, -0.4, 0.3])[inputs["completion_ids"] % 3]
            sampling[0, -1] = float("nan")  # a token vLLM could not score
            inputs["ref_per_token_logps"] = current - shift.flip(0)
            cases = {
                "deferred": {**inputs, "sampling_per_token_logps": sampling},
                "given": {
                    **inputs,
                    "old_per_token_logps": current + shift,
                    "importance_sampling_ratio": torch.exp(shift.flip(1)).clamp(max=3.0),
                },
            }
            entry: dict[str, Any] = {
                "no_grad": {
                    "old": float((forwards["fused"]["old"] - forwards["materialized"]["old"]).abs().max()),
                    "ref": float((forwards["fused"]["ref"] - forwards["materialized"]["ref"]).abs().max()),
                    "vocab_rows": {k: v["vocab_rows"] for k, v in forwards.items()},
                },
                "completion_tokens": int(inputs["completion_mask"].sum()),
                "completion_length": int(inputs["completion_ids"].size(1)),
            }
            for case, case_inputs in cases.items():
                fused = _score(trainer, case_inputs, case == "deferred", vocab)
                with materialized:
                    reference = _score(trainer, case_inputs, case == "deferred", vocab)
                entry[case] = _difference(fused, reference)
            results[loss_type] = entry
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
