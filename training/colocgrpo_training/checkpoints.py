"""Checkpoints: which one to resume from, a completeness marker, and save-on-SIGTERM.

transformers writes `checkpoint-<step>/` under the output dir; a pod killed mid-save leaves a
half-written one that has the right name. We only trust a checkpoint that has both
`trainer_state.json` (written last by transformers' own save) and our marker, which
`CheckpointMarker` writes after every rank has finished saving, and removes before a save
writes into a folder that holds an older save of the same step.

Every rank lists the folder itself, and listings of one shared volume can differ between pods
(a listing that lags, a marker not yet visible). Loading is a collective under DeepSpeed, so
the ranks agree on the step first (`agreed_resume_checkpoint`): the newest one every rank
sees complete.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from colocgrpo_training.agreement import any_rank, barrier, gather
from colocgrpo_training.console import say_line
from colocgrpo_training.verdict import AgreedError

log = logging.getLogger(__name__)

COMPLETE_MARKER = "COLOCGRPO_COMPLETE"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / "trainer_state.json").is_file() and (checkpoint / COMPLETE_MARKER).is_file()


def checkpoints_by_step(output_dir: str | Path) -> list[tuple[int, Path]]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_NAME.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def complete_steps(output_dir: str | Path) -> list[int]:
    """Steps of the checkpoints that finished saving, as this process sees them, oldest first;
    incomplete ones are logged and skipped."""
    steps = []
    for step, path in checkpoints_by_step(output_dir):
        if is_complete(path):
            steps.append(step)
        else:
            log.warning(
                "skipping incomplete checkpoint %s (step %d): no %s or trainer_state.json", path, step, COMPLETE_MARKER
            )
    return steps


class ResumeDisagreementError(RuntimeError, AgreedError):
    """The ranks see no complete checkpoint in common, though some see one; raised on every rank alike."""


def common_resume_step(per_rank: list[list[int]], output_dir: str | Path = "checkpoint.dir") -> int | None:
    """The newest step every rank sees complete; None when no rank sees any (a fresh start).

    When some ranks see checkpoints and the ranks have none in common, resuming from any
    of them would load different states (or none) on different ranks: an error naming what
    each rank sees."""
    if not any(per_rank):
        return None
    common = set(per_rank[0]).intersection(*per_rank[1:])
    if common:
        step = max(common)
        newer = {rank: [s for s in steps if s > step] for rank, steps in enumerate(per_rank)}
        newer = {rank: steps for rank, steps in newer.items() if steps}
        if newer:
            log.warning(
                "resuming from step %d, the newest checkpoint every rank sees complete; newer ones seen by only "
                "some ranks: %s",
                step,
                "; ".join(f"rank {rank}: {steps}" for rank, steps in newer.items()),
            )
        return step
    seen = "; ".join(f"rank {rank}: {steps or 'none'}" for rank, steps in enumerate(per_rank))
    raise ResumeDisagreementError(
        f"checkpoint.dir {output_dir}: no checkpoint is complete on every rank ({seen}), so the ranks cannot "
        "resume from the same step. Every pod must mount the same checkpoint volume (spec.checkpoint.claimName, "
        "ReadWriteMany for several nodes); if it is shared, a listing may lag: the job's next attempt retries"
    )


def agreed_resume_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint every rank resumes from (a collective: every rank calls it, once)."""
    steps = complete_steps(output_dir)
    step = common_resume_step([list(s or []) for s in gather(steps)], output_dir)
    return None if step is None else Path(output_dir) / f"checkpoint-{step}"


class CheckpointMarker(TrainerCallback):
    """Marks a checkpoint complete once every rank has returned from saving it, and unmarks a step's folder before a
    save writes into it again."""

    def __init__(self) -> None:
        self.last_checkpoint: Path | None = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Before a save (after every callback that decides on one: the flow's schedule, `SaveOnTermination`), rank 0
        removes the marker of the folder it goes to, then every rank waits for it. The folder exists where a run
        resumed from an older step than one saved before (the ranks' listings differed): a save killed midway would
        otherwise leave the old marker on a mix of old and new files, and the next start would resume from it.
        `should_save` is equal on every rank (step counts, the agreed SIGTERM), so is this barrier."""
        if control.should_save:
            assert args.output_dir is not None  # TrainingArguments.__post_init__ fills in a default
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero:
                (checkpoint / COMPLETE_MARKER).unlink(missing_ok=True)
            barrier()
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        assert args.output_dir is not None  # TrainingArguments.__post_init__ fills in a default
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        barrier()  # DeepSpeed writes shards from every rank; rank 0 must not mark early
        if state.is_world_process_zero and checkpoint.is_dir():
            (checkpoint / COMPLETE_MARKER).write_text(f"{state.global_step}\n")
        self.last_checkpoint = checkpoint
        return control


class TerminationRequest:
    """SIGTERM → set a flag; `SaveOnTermination` turns it into save-and-stop at the next step end.

    The handler does no work itself: saving from inside a signal handler would race the
    training step and the collectives other ranks are in.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.signal_number: int | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._handle)

    def ignore_further(self) -> None:
        """The checkpoint is saved and the process exits with EXIT_TERMINATED: a further SIGTERM
        must not turn that into a death by signal. torch's launcher sends one to every rank still
        running once one rank has exited, and Python's own handler is gone while the interpreter
        shuts down (an ignored signal stays ignored)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def describe(self) -> str:
        """What stopped this process: its own signal, or (ranks agree to stop together) another rank's."""
        return f"signal {self.signal_number}" if self.signal_number is not None else "a signal to another rank"

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal_number = signum
        self.requested.set()
        say_line(f"colocgrpo: received signal {signum}; saving a checkpoint at the end of this step")


def any_rank_requested(local: bool) -> bool:
    """Every rank must agree to stop at the same step, or the save's collectives deadlock."""
    return any_rank(local)


class SaveOnTermination(TrainerCallback):
    def __init__(self, request: TerminationRequest) -> None:
        self.request = request
        self.stopped_at_step: int | None = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if any_rank_requested(self.request.requested.is_set()):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
        return control
