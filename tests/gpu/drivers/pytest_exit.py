"""pytest plugin for the GPU suites' processes (`-p tests.gpu.drivers.pytest_exit`): once pytest has reported,
leave as the trainer's pods do — `colocgrpo_training.entrypoint.exit_process` with pytest's exit status, without
the interpreter's finalization, where a torch process-group thread releasing a finished collective can abort a rank
(SIGABRT) after its tests passed. NCCL's watchdog releases finished work up to its poll interval late, so the ranks
of a multi-GPU suite are the likeliest to meet it."""

from __future__ import annotations

import pytest

_exit_status: int | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The last hook: the reports, junit files and terminal summary are written by now."""
    if _exit_status is not None:
        from colocgrpo_training.entrypoint import exit_process

        exit_process(_exit_status)
