"""`ColocGRPOTrainer`: TRL 1.16's GRPOTrainer with colocated generation routed through
`ColocatedVLLM` and its sleep-policy controller.

TRL internals this relies on (why the package pins trl>=1.16,<1.17), kept to a minimum:
1. `trl.trainer.grpo_trainer.VLLMGeneration` — the module-level name GRPOTrainer.__init__
   instantiates; swapped for a `ColocatedVLLM` factory for the duration of
   `super().__init__` only, so TRL builds our engine with its usual keyword arguments.
2. `self.vllm_generation` with TRL's `sync_weights()` / `generate(...)` call pattern in
   `_generate_single_turn` (sync when `state.global_step` changed, then generate).
3. `_prepare_inputs` and its micro-step counter `self._step`, to predict, before each
   generate, whether an optimizer step comes before the next one (auto's hint).
4. `_get_per_token_logps_and_entropies(..., batch_size=...)`, its rows per forward: the no-grad
   forwards (the old log-probs of a generation, the reference model's) take more rows per forward
   (`no_grad_rows`); the values are the same, the forwards fewer.
5. Old log-probs from the training forward (`defer_old_logps`, old_logps.py): TRL's
   `_prepare_inputs` (generate, shuffle, split into `_buffered_inputs`), the generation's no-grad
   forward being the first `_get_per_token_logps_and_entropies` call on `self.model`, its five
   sampling metrics in `self._metrics`, and `_compute_loss` reading `old_per_token_logps` (None:
   the training forward's, detached) and `importance_sampling_ratio` from its inputs after its forward.
Everything else (rewards, advantages, loss, logging, checkpoints) is TRL's, untouched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Iterator
from typing import Any, Literal, cast

import torch
import trl.trainer.grpo_trainer as grpo_module
from trl import GRPOConfig, GRPOTrainer

from colocgrpo_training.agreement import agree_max
from colocgrpo_training.config import VLLMSettings
from colocgrpo_training.generation.buckets import DEFAULT_BUCKET_BYTES
from colocgrpo_training.generation.checkpointing import PartialRecompute, checkpointing_kept, checkpointing_paused
from colocgrpo_training.generation.old_logps import (
    METRIC_NAMES,
    SamplingStats,
    deferrable_chunks,
    importance_sampling_ratio,
    scored_mask,
)
from colocgrpo_training.generation.schedules import predict_next_generate
from colocgrpo_training.generation.vllm_engine import ColocatedVLLM
from colocgrpo_training.grpo_args import vllm_mismatches
from colocgrpo_training.planner.micro_batches import dropout_settings
from colocgrpo_training.verdict import stage

log = logging.getLogger("colocgrpo.generation")

# Tokens per no-grad forward (the old log-probs of a generation, the reference model's log-probs). TRL
# runs them in chunks of `per_device_train_batch_size` rows, the training micro-batch, although no
# activations are kept for a backward: at 7B, 16 rows of 104 tokens, 8 forwards per generation, each
# paying ZeRO-3's per-module hooks. A no-grad forward holds only one layer's tensors at a time (about
# 115 KB per token at 7B: hidden states, q/k/v, the MLP's gate, up and product in bf16), so 8192 tokens
# hold about 0.9 GiB, no more than one checkpointed micro-batch of the bench's large size already needs.
DEFAULT_NO_GRAD_TOKENS = 8192


def no_grad_rows(train_rows: int, sequence_tokens: int, no_grad_tokens: int) -> int:
    """Rows per no-grad forward: as many as `no_grad_tokens` allows, never fewer than TRL's (the
    training micro-batch); `no_grad_tokens` 0 keeps TRL's chunking.

    Under ZeRO-3 every forward is a chain of collectives, so `sequence_tokens` must be equal on every rank (the
    trainer passes the longest padded sequence over all ranks, `agreement.agree_max`): TRL pads each rank's batch
    to that rank's own longest completion, and rows sized from it would give ranks different numbers of forwards."""
    if no_grad_tokens <= 0:
        return train_rows
    return max(train_rows, no_grad_tokens // max(1, sequence_tokens))


def deferral_off_reason(
    steps_per_generation: int, gradient_accumulation_steps: int, model_config: dict[str, Any]
) -> str | None:
    """Why a job's old log-probs cannot come from the training forward (None: they can), from settings equal on
    every rank.

    `deferrable_chunks` places optimizer steps every G micro-steps counted from the trainer's micro-step counter.
    transformers restarts its accumulation windows at every epoch (and cuts the epoch's last one short), so that
    count is right only where every window boundary falls on a multiple of G of the counter: where S is a multiple of
    G (an epoch, a multiple of S micro-steps, is then one of G too), or where G is a multiple of S (a generation's
    chunks then always share one window, wherever the windows start). Dropout draws other masks in the loss's
    forward than a separate forward would, so the ratio of a deferred micro-batch would be 1 where TRL's is not."""
    s, g = steps_per_generation, gradient_accumulation_steps
    if s % g != 0 and g % s != 0:
        return (
            f"steps_per_generation {s} and gradient_accumulation_steps {g}: neither divides the other, so "
            "optimizer steps cannot be placed ahead across epochs"
        )
    dropout = dropout_settings(model_config)
    if dropout:
        return f"the model trains with dropout ({', '.join(dropout)})"
    return None


@contextlib.contextmanager
def _vllm_generation_class(factory: Any) -> Iterator[None]:
    original = grpo_module.VLLMGeneration
    grpo_module.VLLMGeneration = factory  # type: ignore[misc]  # the one name TRL builds its engine from
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = original  # type: ignore[misc]


class ColocGRPOTrainer(GRPOTrainer):
    """GRPOTrainer + `generation_settings: VLLMSettings` (colocated vLLM under a sleep policy).

    With `generation_settings.enabled` False it is TRL's GRPOTrainer generating with
    transformers (the CPU path). `args` keeps every TRL option; the vLLM options that
    VLLMSettings owns (use_vllm, vllm_mode, TP size, memory utilization, max model length,
    sleep mode) must be the ones `grpo_args.vllm_args` writes from it: a difference is a
    ValueError naming each, never overwritten.

    `defer_old_logps` (default True): with vLLM's importance-sampling correction on (TRL's default),
    `num_iterations` 1, no dropout and steps_per_generation a multiple of gradient_accumulation_steps or
    the other way round (`deferral_off_reason`), the micro-batches trained before the next optimizer step
    take their old log-probs and correction from their own training forward instead of a no-grad forward
    after generating (old_logps.py); the same quantities, one forward fewer over those rows. False: TRL's way.

    `checkpointed_layers` (the planner's `Recompute`, None: as GRPOConfig says): with gradient checkpointing on,
    only the first that many decoder layers recompute their forward in the backward (checkpointing.py).
    """

    args: GRPOConfig  # Trainer annotates it as TrainingArguments

    def __init__(
        self,
        *args: Any,
        generation_settings: VLLMSettings,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        no_grad_tokens: int = DEFAULT_NO_GRAD_TOKENS,
        defer_old_logps: bool = True,
        checkpointed_layers: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.generation_settings = generation_settings
        self.no_grad_tokens = no_grad_tokens
        self.defer_old_logps = defer_old_logps
        self._placeholder_old_logps = False  # the generation's old-log-prob forward is skipped
        # This generation's deferred micro-batches not scored yet (each leaves when its loss's forward scores it).
        self._deferred_chunks: list[dict[str, Any]] = []
        self._ratio_pending: dict[str, Any] | None = None  # the micro-batch whose loss forward runs now
        self._sampling_stats: SamplingStats | None = None  # this generation's metrics, added up as scored
        self._deferral_off: str | None = "no colocated vLLM"  # why old log-probs are never deferred (None: they can be)
        # GRPOTrainer's own parameters, however they were passed.
        given = inspect.signature(GRPOTrainer.__init__).bind_partial(self, *args, **kwargs).arguments
        grpo_args = given.get("args")
        if grpo_args is None:
            raise ValueError("ColocGRPOTrainer needs an explicit GRPOConfig as `args`")
        if given.get("rollout_func") is not None and generation_settings.enabled:
            raise ValueError(
                "rollout_func is not supported with colocated vLLM: it may drive the engine around the "
                "sleep-policy controller (vllm.enabled must be false to use it)"
            )
        agentic = [name for name in ("tools", "environment_factory") if given.get(name)]
        if agentic and generation_settings.enabled:
            # TRL's tool loop generates again for the samples that called a tool, so ranks make
            # different numbers of generate calls; each colocated generate ends in collectives
            # over all ranks (the sleep-policy agreement, the ZeRO-3 push): unequal counts hang.
            raise ValueError(
                f"{' and '.join(agentic)} (tool calling, multi-turn generation) is not supported with colocated "
                "vLLM yet: ranks would make different numbers of generate calls, and every generate is a "
                "collective over all ranks"
            )
        mismatches = vllm_mismatches(generation_settings, vars(grpo_args))
        if mismatches:
            raise ValueError(
                "the GRPOConfig's vLLM settings differ from generation_settings (build them with "
                f"grpo_args.vllm_args): {'; '.join(mismatches)}"
            )
        if checkpointed_layers is not None:
            callbacks = [*(kwargs.get("callbacks") or []), PartialRecompute(checkpointed_layers)]
            kwargs["callbacks"] = callbacks
        if not generation_settings.enabled:
            super().__init__(*args, **kwargs)
            return
        factory = functools.partial(
            ColocatedVLLM, settings=generation_settings, seed=grpo_args.seed, bucket_bytes=bucket_bytes
        )
        with _vllm_generation_class(factory):
            super().__init__(*args, **kwargs)
        engine = cast(ColocatedVLLM, self.vllm_generation)  # built by the factory above
        engine.weight_version = lambda: self.state.global_step
        engine.deepspeed_engine = self._deepspeed_engine
        self._deferral_off = self._deferral_off_reason()

    def _deferral_off_reason(self) -> str | None:
        """Why this job takes TRL's old-log-prob forward for every micro-batch (None: it defers where it can).
        Derived from settings equal on every rank, so every rank takes the same forwards; logged once."""
        if not self.defer_old_logps:
            return "defer_old_logps is off"
        config = getattr(self.model, "config", None)
        reason = deferral_off_reason(
            cast(int, self.args.steps_per_generation),
            self.args.gradient_accumulation_steps,
            config.to_dict() if config is not None else {},
        )
        if reason is not None:
            log.info("old log-probs: one forward after each generation, as TRL does (%s)", reason)
        return reason

    # -- stages: a failure in one ends every rank with its cause (verdict.py) ------------------
    def _generate_and_score_completions(self, inputs: Any) -> Any:
        # TRL re-enables checkpointing on every layer after its no-grad forwards (checkpointing.py): each layer
        # keeps the setting it had.
        with stage(f"in generation and rewards at step {self.state.global_step}"), checkpointing_kept(self.model):
            return super()._generate_and_score_completions(inputs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        with stage(f"saving checkpoint-{self.state.global_step}"):
            super()._save_checkpoint(model, trial)

    # -- hooks -----------------------------------------------------------------------------
    def _deepspeed_engine(self) -> Any:
        if not self.is_deepspeed_enabled:
            return None
        return getattr(self, "deepspeed", None) or getattr(self, "model_wrapped", None)

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        engine = getattr(self, "vllm_generation", None)
        if isinstance(engine, ColocatedVLLM):
            # Trainer.__init__ sets the model; GRPOConfig.__post_init__ fills steps_per_generation in.
            assert self.model is not None and self.args.steps_per_generation is not None
            mode: Literal["train", "eval"] = "train" if self.model.training else "eval"
            engine.next_generate = predict_next_generate(
                micro_step=self._step,
                global_step=self.state.global_step,
                max_steps=self.state.max_steps or self.args.max_steps,
                gradient_accumulation_steps=self.args.gradient_accumulation_steps,
                steps_per_generation=self.args.steps_per_generation,
                num_iterations=self.num_iterations,
                mode=mode,
            )
        if not self._defers_old_logps(generation_batch):
            return super()._prepare_inputs(generation_batch)
        deferred = deferrable_chunks(
            self._step, cast(int, self.args.steps_per_generation), self.args.gradient_accumulation_steps
        )
        metrics = self._metrics["train"]
        logged = {name: len(metrics[name]) for name in METRIC_NAMES}
        self._placeholder_old_logps = True
        try:
            inputs = super()._prepare_inputs(generation_batch)
        finally:
            self._placeholder_old_logps = False
        for name, count in logged.items():
            del metrics[name][count:]  # TRL's values over the placeholder: computed below instead
        self._finish_old_logps(cast(list[dict[str, Any]], self._buffered_inputs), deferred)  # set by the split
        return inputs

    def _defers_old_logps(self, generation_batch: Any) -> bool:
        """This `_prepare_inputs` call generates, and its old log-probs can come from training forwards."""
        assert self.model is not None and self.args.steps_per_generation is not None
        if not (
            self._deferral_off is None
            and self.model.training
            and self.use_vllm
            and self.vllm_importance_sampling_correction
            and self.num_iterations == 1
        ):
            return False
        if self._step % self.args.steps_per_generation != 0 and self._buffered_inputs is not None:
            return False  # a buffered micro-batch, no generation
        # Text only: multimodal inputs take forward arguments this path does not carry.
        rows = generation_batch if isinstance(generation_batch, list) else []
        return not any(isinstance(row, dict) and ("image" in row or "images" in row) for row in rows)

    def _finish_old_logps(self, chunks: list[dict[str, Any]], deferred: list[bool]) -> None:
        """After TRL's generation, shuffle and split: the micro-batches trained after an optimizer step get
        their old log-probs (one no-grad forward over all of them), correction and metrics now; the others
        lose the placeholders and get theirs from their loss's forward (`_compute_loss`)."""
        self._deferred_chunks = [chunk for chunk, defer in zip(chunks, deferred, strict=True) if defer]
        self._sampling_stats = SamplingStats(self.vllm_importance_sampling_mode)
        for chunk in chunks:
            chunk.pop("old_per_token_logps", None)
            chunk.pop("importance_sampling_ratio", None)
        later = [chunk for chunk, defer in zip(chunks, deferred, strict=True) if not defer]
        if not later:
            return
        prompt = torch.cat([chunk["prompt_ids"] for chunk in later])
        completion = torch.cat([chunk["completion_ids"] for chunk in later])
        prompt_mask = torch.cat([chunk["prompt_mask"] for chunk in later])
        completion_mask = torch.cat([chunk["completion_mask"] for chunk in later])
        with torch.no_grad(), checkpointing_paused(self.model):
            old, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                torch.cat([prompt, completion], dim=1),
                torch.cat([prompt_mask, completion_mask], dim=1),
                completion.size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        sampling = torch.cat([chunk["sampling_per_token_logps"] for chunk in later])
        scored = torch.cat([scored_mask(chunk) for chunk in later])
        ratio = self._importance_sampling_ratio(old, sampling, scored)
        self._sampling_stats.add(old, sampling, scored, ratio)
        start = 0
        for chunk in later:
            rows = chunk["completion_ids"].size(0)
            chunk["old_per_token_logps"] = old[start : start + rows]
            chunk["importance_sampling_ratio"] = ratio[start : start + rows]
            start += rows

    def _importance_sampling_ratio(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return importance_sampling_ratio(
            old,
            sampling,
            mask,
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )

    def _log_sampling_metrics(self, stats: SamplingStats) -> None:
        """TRL's five sampling metrics of a whole generation batch, gathered across ranks as TRL gathers them
        (a collective: every rank calls it after its last deferred micro-batch)."""
        from trl.trainer.utils import nanmax, nanmin

        values = stats.values(self.accelerator.device)
        gather = self.accelerator.gather
        diff_mean, diff_max, ratio_min, ratio_mean, ratio_max = (values[name] for name in METRIC_NAMES)
        reduced = (
            gather(diff_mean).mean(),
            gather(diff_max).max(),
            nanmin(gather(ratio_min)),
            gather(ratio_mean).nanmean(),
            nanmax(gather(ratio_max)),
        )
        for name, value in zip(METRIC_NAMES, reduced, strict=True):
            self._metrics["train"][name].append(value.item())

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        # By identity: the micro-batch objects TRL buffered at the last generation, each scored once.
        index = next((i for i, chunk in enumerate(self._deferred_chunks) if chunk is inputs), None)
        if index is None:
            return super()._compute_loss(model, inputs)
        del self._deferred_chunks[index]
        self._ratio_pending = inputs  # its forward below sets the correction before the loss reads it
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._ratio_pending = None

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: int,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> Any:
        if self._placeholder_old_logps and not torch.is_grad_enabled() and model is self.model:
            # The generation's old-log-prob forward: skipped (see _finish_old_logps). The placeholder is NaN,
            # so that a value derived from it and left in place would show, not pass for a ratio of 1.
            self._placeholder_old_logps = False
            return torch.full((input_ids.size(0), logits_to_keep), math.nan, device=input_ids.device), None, None
        if batch_size and not torch.is_grad_enabled() and self.no_grad_tokens > 0:
            # No activations are kept: larger chunks, the same values (rows are independent). Every rank takes
            # this forward here (TRL's generation and reference forwards are collectives already), and the chunk
            # size comes from the longest sequence of any rank, so every rank runs the same number of forwards.
            longest = int(agree_max(float(input_ids.size(1))))
            batch_size = no_grad_rows(batch_size, longest, self.no_grad_tokens)
        result = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
        )
        pending = self._ratio_pending
        if pending is not None and torch.is_grad_enabled():
            # The loss's forward of a micro-batch trained by the policy that generated it: its detached
            # log-probs are the old ones (TRL then uses them as such), and the correction comes from them.
            self._ratio_pending = None
            logps = result[0].detach()
            mask = scored_mask(pending)
            ratio = self._importance_sampling_ratio(logps, pending["sampling_per_token_logps"], mask)
            pending["importance_sampling_ratio"] = ratio
            stats = self._sampling_stats
            assert stats is not None  # set with the deferred micro-batches (_finish_old_logps)
            stats.add(logps, pending["sampling_per_token_logps"], mask, ratio)
            if not self._deferred_chunks:  # the generation's last: its metrics, once, as TRL logs them
                self._log_sampling_metrics(stats)
                self._sampling_stats = None
        return result

    def _load_from_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._load_from_checkpoint(*args, **kwargs)
        self._invalidate_engine("trainer loaded a checkpoint")
        return result

    def _load_best_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._load_best_model(*args, **kwargs)
        self._invalidate_engine("trainer loaded its best checkpoint")
        return result

    def _invalidate_engine(self, why: str) -> None:
        engine = getattr(self, "vllm_generation", None)
        if isinstance(engine, ColocatedVLLM):
            engine.controller.invalidate(why)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        engine = getattr(self, "vllm_generation", None)
        if isinstance(engine, ColocatedVLLM):
            logs = {**logs, **engine.metrics()}
        super().log(logs, *args, **kwargs)

    def generation_metrics(self) -> dict[str, float]:
        """Counters for the benchmark: pushes, bytes pushed, wake/sleep/push/generate seconds."""
        engine = getattr(self, "vllm_generation", None)
        return engine.metrics() if isinstance(engine, ColocatedVLLM) else {}
