"""Fatal-error classification and the termination message the operator reads.

On a fatal error every rank writes `{"reason": ..., "message": ...}` to the container's
termination-message file (env COLOCGRPO_TERMINATION_LOG, default /dev/termination-log)
and the process exits non-zero. The operator maps `reason` to a condition reason, so the
reasons are a contract (see REASONS); the message is for humans.

Classification is by exception type first and by message text second: CUDA and NCCL
failures often reach Python as a plain RuntimeError whose text is the only clue.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from colocgrpo_training.console import say_line

TERMINATION_LOG_ENV = "COLOCGRPO_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

CUDA_OUT_OF_MEMORY = "CUDAOutOfMemory"
NCCL_TIMEOUT = "NCCLTimeout"
VLLM_ERROR = "VLLMError"
INVALID_CONFIG = "InvalidConfig"
DATA_ERROR = "DataError"
# The user's code: a reward function raised (the message names it as module:function).
REWARD_FUNCTION_ERROR = "RewardFunctionError"
TRAINER_ERROR = "TrainerError"
# Not a failure: SIGTERM arrived, a checkpoint was saved and the process stopped early.
TERMINATED = "Terminated"

REASONS = (
    CUDA_OUT_OF_MEMORY,
    NCCL_TIMEOUT,
    VLLM_ERROR,
    INVALID_CONFIG,
    DATA_ERROR,
    REWARD_FUNCTION_ERROR,
    TRAINER_ERROR,
    TERMINATED,
)

# Exit codes. 143 (128 + SIGTERM) is what the kubelet would report had the signal killed us,
# so a pod that saved and stopped on SIGTERM looks to the Job controller like any other
# terminated pod (retried, not counted as success; a succeeded index would end the Job early).
EXIT_FAILED = 1
EXIT_INVALID_CONFIG = 2
EXIT_TERMINATED = 143

# Kubernetes keeps at most 4096 bytes of a termination message.
_MAX_MESSAGE_BYTES = 3500

_OOM_TEXT = ("cuda out of memory", "outofmemoryerror", "cuda error: out of memory", "cublas_status_alloc_failed")
_NCCL_TEXT = (
    "watchdog caught collective operation timeout",
    "nccl timeout",
    "collective operation timeout",
    "ncclsystemerror",
    "nccl error",
    "ncclremoteerror",
    "timed out waiting for",  # rendezvous / store timeouts
    "distnetworkerror",
    "disttimeouterror",
    # gloo's transport when a peer's process ended in the middle of a collective
    "connection closed by peer",
    "connection reset by peer",
)


# The Hub's answers that a name or revision does not exist (huggingface_hub's, datasets'); GatedRepoError, a
# subclass of the first, is a missing grant of access: a retry without a change of config fails alike.
_NOT_FOUND = frozenset({"RepositoryNotFoundError", "RevisionNotFoundError", "DatasetNotFoundError"})


class InvalidConfigError(Exception):
    """The trainer config is unusable; the message names the field."""


class RewardFunctionError(Exception):
    """A reward function raised, or returned other than one reward per completion; the message names the function
    as `module:function` and its config entry (`rewards[i]`)."""


class TrainerTerminated(Exception):
    """Raised after a SIGTERM-triggered checkpoint so the entrypoint exits with EXIT_TERMINATED."""


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str
    exit_code: int = EXIT_FAILED

    def to_json(self) -> str:
        return json.dumps({"reason": self.reason, "message": _truncate(self.message)})


def _type_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__} | {
        f"{cls.__module__}.{cls.__name__}" for cls in type(exc).__mro__
    }


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes/contexts: a vLLM or CUDA error is often wrapped."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(exc: BaseException) -> Failure:
    """Map an exception to the reason the operator shows (pure; no I/O)."""
    from colocgrpo_training.data import DataError  # light module, no torch

    text = f"{type(exc).__name__}: {exc}"
    chain = _chain(exc)

    for item in chain:
        if isinstance(item, TrainerTerminated):
            return Failure(TERMINATED, str(item), EXIT_TERMINATED)
        if isinstance(item, InvalidConfigError):
            return Failure(INVALID_CONFIG, str(item), EXIT_INVALID_CONFIG)
        if isinstance(item, DataError):
            return Failure(DATA_ERROR, str(item))
        if isinstance(item, RewardFunctionError):  # before its cause: the user's code, whatever it raised
            return Failure(REWARD_FUNCTION_ERROR, str(item))
        names = _type_names(item)
        if names & _NOT_FOUND:  # the Hub says the model, dataset or revision is not there: the same on a retry
            return Failure(INVALID_CONFIG, text, EXIT_INVALID_CONFIG)
        if "OutOfMemoryError" in names and any(n.startswith("torch") for n in names):
            return Failure(CUDA_OUT_OF_MEMORY, f"{type(item).__name__}: {item}")
        if names & {"DistNetworkError", "DistStoreError", "DistBackendError"}:
            return Failure(NCCL_TIMEOUT, f"{type(item).__name__}: {item}")

    for item in chain:
        lowered = f"{type(item).__name__}: {item}".lower()
        if any(marker in lowered for marker in _OOM_TEXT):
            return Failure(CUDA_OUT_OF_MEMORY, f"{type(item).__name__}: {item}")
        if any(marker in lowered for marker in _NCCL_TEXT):
            return Failure(NCCL_TIMEOUT, f"{type(item).__name__}: {item}")

    for item in chain:
        if _raised_in_vllm(item):
            return Failure(VLLM_ERROR, f"{type(item).__name__}: {item}")

    return Failure(TRAINER_ERROR, text)


# The wrapper's code that drives vLLM; `generation/trainer.py`, TRL's trainer subclass, is on the path of every
# training step, so its frames say nothing about vLLM.
_ENGINE_WRAPPER = "/colocgrpo_training/generation/vllm_engine.py"


def _raised_in_vllm(exc: BaseException) -> bool:
    if type(exc).__module__.split(".")[0] == "vllm":
        return True
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/vllm/" in filename or filename.endswith(_ENGINE_WRAPPER):
            return True
        tb = tb.tb_next
    return False


def _truncate(message: str) -> str:
    encoded = message.encode("utf-8")
    if len(encoded) <= _MAX_MESSAGE_BYTES:
        return message
    # Keep the end: the last lines of an error usually say what went wrong.
    return "…" + encoded[-_MAX_MESSAGE_BYTES:].decode("utf-8", errors="ignore")


def termination_log_path() -> Path:
    return Path(os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG))


# The processes of one pod share one termination-message file. When one rank fails (say, CUDA
# out of memory), the others fail later with secondary errors (an NCCL timeout while waiting for
# it); the root cause must not be overwritten. Higher wins; equal keeps the first writer.
_PRECEDENCE = {
    TERMINATED: 0,
    NCCL_TIMEOUT: 1,
    TRAINER_ERROR: 2,
    CUDA_OUT_OF_MEMORY: 3,
    VLLM_ERROR: 3,
    DATA_ERROR: 3,
    REWARD_FUNCTION_ERROR: 3,
    INVALID_CONFIG: 3,
}
# Messages older than this process are from an earlier run (host runs reuse the path).
_PROCESS_START = time.time()


def _should_replace(path: Path, new_reason: str) -> bool:
    try:
        if path.stat().st_mtime < _PROCESS_START:
            return True
        existing = json.loads(path.read_text() or "{}").get("reason")
    except (OSError, ValueError, AttributeError):
        return True
    if existing is None:
        return True
    return _PRECEDENCE.get(new_reason, 2) > _PRECEDENCE.get(existing, 2)


def write_termination_message(failure: Failure) -> None:
    """Best effort: a missing /dev/termination-log (host runs) must not hide the real error."""
    path = termination_log_path()
    try:
        if _should_replace(path, failure.reason):
            path.write_text(failure.to_json())
    except OSError as err:
        say_line(f"colocgrpo: could not write termination message to {path}: {err}", sys.stderr)
