"""Run a function in `world` CPU processes joined by a gloo process group (torch's spawn), for
tests of the trainer's collectives without launching a trainer. Workers live here, in an
importable module, because spawned processes import them by name."""

from __future__ import annotations

import json
import os
from pathlib import Path

from colocgrpo_dev.ports import free_port


def run_world(worker, world: int, *args) -> None:
    import torch.multiprocessing as mp

    port = free_port()
    # A hang fails the test instead of stalling: every collective gives up after the timeout.
    mp.start_processes(worker, args=(world, port, *args), nprocs=world, join=True, start_method="spawn")


def _join(rank: int, world: int, port: int) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def resume_agreement(rank: int, world: int, port: int, roots: dict[str, str], out: str) -> None:
    """`agreed_resume_checkpoint` on this rank's own view (`<root>/rank<R>`) of each case's folder."""
    import torch.distributed as dist

    from colocgrpo_training.checkpoints import ResumeDisagreementError, agreed_resume_checkpoint

    _join(rank, world, port)
    results = {}
    for case, root in roots.items():
        try:
            found = agreed_resume_checkpoint(Path(root) / f"rank{rank}")
            results[case] = {"checkpoint": None if found is None else found.name}
        except ResumeDisagreementError as err:
            results[case] = {"error": str(err)}
    dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))
