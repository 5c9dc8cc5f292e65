"""One GRPO run: config → tokenizer, prompts, rewards, GRPOConfig → TRL trainer → train.

With vLLM enabled the trainer is our `ColocGRPOTrainer` (generation/, the only code that
touches vLLM); without it (CPU jobs) TRL's plain GRPOTrainer generates with transformers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colocgrpo_training.agreement import barrier
from colocgrpo_training.checkpoints import (
    CheckpointMarker,
    SaveOnTermination,
    TerminationRequest,
    agreed_resume_checkpoint,
    any_rank_requested,
)
from colocgrpo_training.config import TrainerConfig
from colocgrpo_training.console import say_line
from colocgrpo_training.data import (
    agree_on_dataset,
    apply_chat_template,
    load_prompt_dataset,
    require_enough_prompts,
    require_local_path,
    truncate_prompts,
)
from colocgrpo_training.failures import (
    EXIT_TERMINATED,
    TERMINATED,
    Failure,
    InvalidConfigError,
    write_termination_message,
)
from colocgrpo_training.grpo_args import build_grpo_config
from colocgrpo_training.progress import ProgressReporter
from colocgrpo_training.rewards import RewardError, accuracy_needed, resolve_rewards
from colocgrpo_training.verdict import stage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

FINAL_MODEL_DIRNAME = "final"


def load_tokenizer(config: TrainerConfig) -> PreTrainedTokenizerBase:
    """The model's tokenizer, left padded, with the configured chat template; a local model path that does not exist
    is an `InvalidConfigError` (not retried)."""
    from transformers import AutoTokenizer

    require_local_path(config.model.name_or_path, "model.name")

    # Left padding/truncation: generation appends to the right of the prompt.
    tokenizer = AutoTokenizer.from_pretrained(
        config.model.name_or_path,
        revision=config.model.revision,
        padding_side="left",
        truncation_side="left",
    )
    apply_chat_template(tokenizer, config.dataset)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def trainer_class(config: TrainerConfig) -> tuple[type, dict[str, Any]]:
    """The trainer class and the extra constructor kwargs it needs."""
    if config.vllm.enabled:
        try:
            from colocgrpo_training.generation import ColocGRPOTrainer
        except ImportError as err:
            # A broken image, not a bad config: classified from the chained ImportError.
            raise RuntimeError(
                f"vllm.enabled is true but the vLLM generation wrapper cannot be imported ({err}); "
                "CPU jobs run with vllm.enabled false"
            ) from err
        return ColocGRPOTrainer, {"generation_settings": config.vllm}
    from trl import GRPOTrainer

    return GRPOTrainer, {}


def run_grpo(config: TrainerConfig, termination: TerminationRequest) -> int:
    """Set up, train and save one run; the exit code (0, or `EXIT_TERMINATED` after a SIGTERM's checkpoint).

    Each stage runs under `verdict.stage`: a failure of any rank in it is announced to every rank, which all end with
    that rank's cause (docs/trainer.md, "Failures every rank agrees on")."""
    with stage("in setup"):
        run = _set_up(config, termination)
        trainer = run.trainer
        # SIGTERM while loading: nothing new to save. Agreed, because a SIGTERM that reached only
        # some ranks would otherwise leave the others waiting in training's first collective.
        if any_rank_requested(termination.requested.is_set()):
            message = f"stopped by {termination.describe()} before the first step"
            say_line(f"colocgrpo: {message}")
            if trainer.is_local_process_zero():  # one writer per pod (processes share the file)
                write_termination_message(Failure(TERMINATED, message, EXIT_TERMINATED))
            return EXIT_TERMINATED
        resume_from = None
        if config.checkpoint.resume == "auto":
            # Every rank must load the same step (DeepSpeed's load is a collective).
            resume_from = agreed_resume_checkpoint(config.checkpoint.dir)
            if resume_from is not None:
                log.warning("resuming from %s", resume_from)
                run.reporter.last_checkpoint = str(resume_from)

    with stage("in training"):  # generation and rewards, the offload and each save name their own stages
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)

    if run.stop_on_sigterm.stopped_at_step is not None:
        checkpoint = run.marker.last_checkpoint
        message = (
            f"stopped by {termination.describe()} at step {run.stop_on_sigterm.stopped_at_step}; "
            f"checkpoint {checkpoint} saved, the next run resumes from it"
        )
        say_line(f"colocgrpo: {message}")
        if trainer.is_local_process_zero():  # one writer per pod (processes share the file)
            write_termination_message(Failure(TERMINATED, message, EXIT_TERMINATED))
        return EXIT_TERMINATED

    if config.checkpoint.save_final_model:
        final_dir = Path(config.checkpoint.dir) / FINAL_MODEL_DIRNAME
        with stage("saving the final model"):
            trainer.save_model(str(final_dir))  # gathers ZeRO-3 shards into one HF model folder
            if trainer.is_world_process_zero():
                run.tokenizer.save_pretrained(str(final_dir))
            barrier()  # every rank leaves the save together: a rank that failed in it stops the others
        if trainer.is_world_process_zero():
            say_line(f"colocgrpo: final model saved to {final_dir}")
    return 0


@dataclass
class _Run:
    """What setting up built: the trainer, its tokenizer and the callbacks the run reads after training."""

    trainer: Any
    tokenizer: PreTrainedTokenizerBase
    stop_on_sigterm: SaveOnTermination
    marker: CheckpointMarker
    reporter: ProgressReporter


def _set_up(config: TrainerConfig, termination: TerminationRequest) -> _Run:
    """Rewards, tokenizer, prompts and the trainer. Building the GRPOConfig starts the process group."""
    grpo_config, merge = build_grpo_config(config, [float(entry.weight) for entry in config.rewards])
    try:
        reward_funcs, _ = resolve_rewards(config.rewards, config.reward_modules_dir)
    except RewardError as err:
        raise InvalidConfigError(str(err)) from err
    tokenizer = load_tokenizer(config)
    dataset = load_prompt_dataset(config.dataset, require_solution=accuracy_needed(config.rewards))
    if config.dataset.max_prompt_tokens is not None:
        dataset = truncate_prompts(dataset, tokenizer, config.dataset.max_prompt_tokens)
    agree_on_dataset(dataset, config.dataset)
    require_enough_prompts(dataset.num_rows, grpo_config, config.dataset)

    marker = CheckpointMarker()
    stop_on_sigterm = SaveOnTermination(termination)
    reporter = ProgressReporter.from_settings(config.job, config.progress)
    cls, extra = trainer_class(config)
    if config.vllm.enabled:  # the planner plans only jobs with colocated vLLM, which ColocGRPOTrainer runs
        extra.update(merge.trainer_options())
    trainer = cls(
        model=config.model.name_or_path,
        reward_funcs=reward_funcs,
        args=grpo_config,
        train_dataset=dataset,
        processing_class=tokenizer,
        # The marker runs before the reporter so lastCheckpoint only names marked checkpoints.
        callbacks=[stop_on_sigterm, marker, reporter],
        **extra,
    )
    return _Run(trainer, tokenizer, stop_on_sigterm, marker, reporter)
