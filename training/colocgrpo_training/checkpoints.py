"""Checkpoints: which one to resume from, a completeness marker, and save-on-SIGTERM.

transformers writes `checkpoint-<step>/` under the output dir; a pod killed mid-save leaves a
half-written one that has the right name. We only trust a checkpoint that has both
`trainer_state.json` (written last by transformers' own save) and our marker, which
`CheckpointMarker` writes after every rank has finished saving.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

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


def latest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint that finished saving; incomplete newer ones are logged and skipped."""
    for step, path in reversed(checkpoints_by_step(output_dir)):
        if is_complete(path):
            return path
        log.warning(
            "skipping incomplete checkpoint %s (step %d): no %s or trainer_state.json", path, step, COMPLETE_MARKER
        )
    return None


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class CheckpointMarker(TrainerCallback):
    """Marks a checkpoint complete once every rank has returned from saving it."""

    def __init__(self) -> None:
        self.last_checkpoint: Path | None = None

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        assert args.output_dir is not None  # TrainingArguments.__post_init__ fills in a default
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        _barrier()  # DeepSpeed writes shards from every rank; rank 0 must not mark early
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

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal_number = signum
        self.requested.set()
        print(f"colocgrpo: received signal {signum}; saving a checkpoint at the end of this step", flush=True)


def _any_rank_requested(local: bool) -> bool:
    """Every rank must agree to stop at the same step, or the save's collectives deadlock."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return local
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class SaveOnTermination(TrainerCallback):
    def __init__(self, request: TerminationRequest) -> None:
        self.request = request
        self.stopped_at_step: int | None = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if _any_rank_requested(self.request.requested.is_set()):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
        return control
