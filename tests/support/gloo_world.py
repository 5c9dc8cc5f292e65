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


def verdict_rank(behaviour: str) -> None:
    """One process of a gloo world for test_verdict.py, ending as the trainer's entrypoint does (any exception
    reported through `verdict.rank_failed`, the verdict watch running; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    in the environment). Every rank joins, then:
    `wait`: waits in a barrier the failing ranks never join, as a healthy rank waits in its next collective;
    `fail`: raises in a stage, then stays alive after reporting (a peer whose exit never reaches the others'
    collective, as under NCCL); `fail-later`: the same 2 s later with another error, then exits."""
    import datetime
    import time
    import traceback

    import torch.distributed as dist

    from colocgrpo_training.entrypoint import _end_with, exit_process
    from colocgrpo_training.verdict import Watch, rank_failed, stage

    Watch(end=_end_with).start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    dist.barrier()
    code = 0
    try:
        if behaviour == "wait":
            dist.barrier()
        else:
            if behaviour == "fail-later":
                time.sleep(2)
            with stage("in a test stage"):
                raise ValueError(f"{behaviour} on rank {dist.get_rank()}")
    except Exception as err:
        traceback.print_exc()
        code = rank_failed(err)
    if behaviour == "fail":
        time.sleep(300)
    exit_process(code)


def dataset_agreement(rank: int, world: int, port: int, files: list[str], out: str) -> None:
    """`data.agree_on_dataset` after this rank loaded `files[rank]` as the job's dataset path would be on its node;
    writes `{"agreed": true}` or the error."""
    import torch.distributed as dist

    from colocgrpo_training.config import DatasetSettings
    from colocgrpo_training.data import DatasetMismatchError, agree_on_dataset, load_prompt_dataset

    _join(rank, world, port)
    settings = DatasetSettings(name_or_path=files[rank])
    try:
        agree_on_dataset(load_prompt_dataset(settings), DatasetSettings(name_or_path="/data/train.jsonl"))
        result: dict = {"agreed": True}
    except DatasetMismatchError as err:
        result = {"error": str(err)}
    dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
