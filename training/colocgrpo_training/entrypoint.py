"""`colocgrpo-train --config FILE` (also `python -m colocgrpo_training`): the trainer pods' main program.

Exit codes: 0 done; 1 a failure (reason in the termination message); 2 invalid config;
143 stopped by SIGTERM after saving a checkpoint (the next pod resumes from it). The process ends through
`exit_process`, without the interpreter's finalization.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import logging
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from typing import NoReturn

from pydantic import ValidationError

from colocgrpo_training.config import TrainerConfig
from colocgrpo_training.console import say_line
from colocgrpo_training.cuda_arch import make_arch_list_deepspeed_readable
from colocgrpo_training.failures import EXIT_TERMINATED, InvalidConfigError
from colocgrpo_training.launch import record_exit_code
from colocgrpo_training.verdict import Watch, rank_failed


def load_config(path: str) -> TrainerConfig:
    """The trainer config, or InvalidConfigError naming the bad field."""
    try:
        return TrainerConfig.load(path)
    except FileNotFoundError as err:
        raise InvalidConfigError(f"trainer config {path} does not exist") from err
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
        raise InvalidConfigError(f"trainer config {path}: {problems}") from err
    except ValueError as err:  # bad YAML or an unsupported version
        raise InvalidConfigError(f"trainer config {path}: {err}") from err


def check_tp_layout(config: TrainerConfig, environ: Mapping[str, str] = os.environ) -> None:
    """InvalidConfigError when `vllm.tensor_parallel_size` cannot group this launch's processes (it must divide the
    processes per node, `$LOCAL_WORLD_SIZE`): checked before any model loads, where vLLM would refuse it only after
    the trainer's model had loaded. The config's own check has held the TP size against `resources.gpus_per_node`;
    this one catches a launch that runs another number of processes per node than the config says."""
    if not config.vllm.enabled:
        return
    from colocgrpo_training.generation.tp_groups import TPLayoutError, form_tp_groups  # pure, no torch

    world = int(environ.get("WORLD_SIZE") or 1)
    per_node = int(environ.get("LOCAL_WORLD_SIZE") or world)
    try:
        form_tp_groups(world, config.vllm.tensor_parallel_size, per_node, per_node_name="$LOCAL_WORLD_SIZE")
    except TPLayoutError as err:
        raise InvalidConfigError(
            f"trainer config: {err} ({world} processes; the config's resources.gpus_per_node is "
            f"{config.resources.gpus_per_node})"
        ) from err


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colocgrpo-train", description="Run one GRPO training job from a trainer config."
    )
    parser.add_argument("--config", required=True, help="trainer config (grpo.yaml rendered by the operator)")
    return parser


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def run(config_path: str) -> int:
    """Load, train, and turn any fatal error into a termination message + exit code."""
    from colocgrpo_training.checkpoints import TerminationRequest

    termination = TerminationRequest()
    termination.install()
    arch_list = make_arch_list_deepspeed_readable()
    if arch_list is not None:
        logging.getLogger(__name__).info("TORCH_CUDA_ARCH_LIST set to %s for DeepSpeed's op builds", arch_list)
    # Another rank's failure ends this process too, with that rank's cause, even while it waits in a collective.
    Watch(end=_end_with).start()
    try:
        config = load_config(config_path)
        check_tp_layout(config)
        from colocgrpo_training.grpo_run import run_grpo  # heavy: torch, transformers, trl

        code = run_grpo(config, termination)
        if code == EXIT_TERMINATED:
            termination.ignore_further()
        return code
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        traceback.print_exc()
        return rank_failed(exc)  # this rank's failure, or the one another rank announced first


def _end_with(code: int) -> NoReturn:
    """How a rank's verdict watch ends the process: the code recorded for the launcher, output flushed, no waiting
    for the main thread (it is blocked in a collective that will not complete)."""
    record_exit_code(code)
    _exit_now(code)


# How long the way out may take before the process ends anyway: a thread that never finishes (a busy worker of a
# user's pool, an `atexit` handler that blocks) must not keep a finished trainer's pod running.
EXIT_DEADLINE_SECONDS = 20.0


def exit_process(code: int) -> NoReturn:
    """End the process with `code` as Python's own exit does — `threading`'s exit hooks run (idle
    `concurrent.futures` pools and `asyncio.to_thread` workers stop), other non-daemon threads joined, the `atexit`
    handlers run (logging's flush, report integrations' uploads), the standard streams flushed — but without the
    interpreter's finalization, and within `EXIT_DEADLINE_SECONDS`.

    Why: a process-group worker thread of torch (gloo's; NCCL's watchdog alike) releases a collective's work after
    the caller has seen it complete, and releasing its tensors takes the GIL. When that comes after finalization has
    begun, CPython ends the thread with a forced unwind through a `noexcept` C++ destructor and the process aborts
    (SIGABRT) although the run finished: a rank of a finished job would exit 134 and read as failed
    (pytorch/pytorch#190489). `destroy_process_group()` cannot join those threads first: DeepSpeed's parameters
    and engine keep the groups alive. docs/decisions.md, "The trainer exits without the interpreter's
    finalization".

    The code is first recorded for the pod's launcher (`launch.record_exit_code`), which exits with the code every
    rank agreed on.

    Args:
        code (`int`): the exit status (see the module's docstring).
    """
    record_exit_code(code)
    backstop = threading.Timer(EXIT_DEADLINE_SECONDS, _exit_now, args=(code, True))
    backstop.daemon = True
    backstop.start()
    _stop_threads()
    atexit._run_exitfuncs()
    _exit_now(code)


def _stop_threads() -> None:
    """What Python's exit does before its `atexit` handlers (CPython's `threading._shutdown`): the hooks that
    `threading._register_atexit` collected run first — `concurrent.futures` stops its idle pool workers there, which
    `join()` alone would wait on forever — then every other non-daemon thread is joined."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
        return
    for thread in threading.enumerate():  # not the main thread (a rank's verdict may end it from another)
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()


def _exit_now(code: int, late: bool = False) -> NoReturn:
    """Flush Python's and C's buffered output, then `os._exit(code)`. `late`: the deadline passed first."""
    if late:
        running = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive())
        say_line(
            f"colocgrpo: the process did not end within {EXIT_DEADLINE_SECONDS:.0f} s of its exit "
            f"(threads still running: {running}); exiting with code {code} anyway",
            sys.stderr,
        )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)  # C libraries' buffered stdio, which os._exit would drop
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), train, and return the exit status."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    return run(args.config)


def console_main() -> NoReturn:
    """The `colocgrpo-train` console script and `python -m colocgrpo_training`: `main`, ended by `exit_process`."""
    exit_process(main())
