"""One verdict on failure: the first failure of any rank stops every rank, each with that rank's cause.

Decisions that change collectives are agreed in-band (agreement.py). A failure cannot be: the rank that fails leaves
the sequence of collectives wherever it raised, and the other ranks block in their next collective until the
process group's timeout (30 min by default) or the elastic agent's SIGKILL, then report a timeout or nothing instead
of the cause. So the failure travels out of band, through the rendezvous store every rank is connected to already:

- `announce(failure)`: a compare-and-set of the store's verdict key, so the first failure of any rank is the
  verdict, and a rank that fails later (often of the first failure) reads it back instead of its own. Every failure
  is announced: where a `stage` ends with an exception, and by the entrypoint's handler for any other.
- `Watch`: a daemon thread on every rank polls the key. When a verdict is there and the main thread has not
  reported it within `GRACE_SECONDS` — it is blocked in a collective that will never complete — the thread reports
  it and ends the process with the verdict's exit code.
- `report(verdict)`: the log line and the termination message, the same on every rank; then it waits, at most
  `SEEN_WAIT_SECONDS`, until every rank has seen the verdict: a rank's exit makes torch's elastic agent stop the
  other ranks of its pod, and a pod's exit takes the store its agent holds with it.

A connection of its own (`Store.clone`) reads and writes the key: the process group's client serialises its
operations, and a rank waiting in the store (a new group waiting for a rank that failed) holds it. Without a process
group of more than one rank the verdict is the process's own failure. docs/trainer.md, "Failures every rank agrees
on"; docs/decisions.md, "One verdict on failure, through the rendezvous store".
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from colocgrpo_training.console import say_line
from colocgrpo_training.failures import Failure, classify, write_termination_message

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
# How long a rank's main thread may take to report a verdict it can see before its watch does it: a main thread
# that unwinds its own exception reports within this; one blocked in a collective never does.
GRACE_SECONDS = 5.0
# How long a reporting rank waits for the others to have seen the verdict (a rank killed outright never does).
SEEN_WAIT_SECONDS = 10.0
_KEY = "colocgrpo/verdict"
_SEEN_KEY = "colocgrpo/verdict-seen"


class AgreedError(Exception):
    """Raised on every rank alike by an in-band agreement (a check whose inputs were gathered from every rank): the
    message names the rank it concerns, so the verdict reads "every rank stopped", not "rank R failed"."""


@dataclass(frozen=True)
class Verdict:
    """The failure every rank reports: the `failure` of `rank` (-1: every rank raised it after an agreement) in
    `stage`, among `world` ranks."""

    failure: Failure
    rank: int = 0
    world: int = 1
    stage: str | None = None

    def message(self) -> str:
        """The human message: the failure's own, after who failed and where when the job has several ranks."""
        where = f" {self.stage}" if self.stage else ""
        if self.world <= 1:
            return self.failure.message
        who = "every rank stopped" if self.rank < 0 else f"rank {self.rank} failed"
        return f"{who}{where}: {self.failure.message}"

    def reported(self) -> Failure:
        """The failure as the termination message carries it: its reason and exit code, `message()`."""
        return Failure(self.failure.reason, self.message(), self.failure.exit_code)

    def to_json(self) -> str:
        failure = self.failure
        return json.dumps(
            {
                "reason": failure.reason,
                "message": failure.message,
                "exit_code": failure.exit_code,
                "rank": self.rank,
                "world": self.world,
                "stage": self.stage,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Verdict:
        data = json.loads(text)
        failure = Failure(str(data["reason"]), str(data["message"]), int(data["exit_code"]))
        return cls(failure, int(data["rank"]), int(data["world"]), data.get("stage"))


class _Process:
    """This process's part: its store connection, the verdict it knows and whether it reported one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.store: Any = None
        self.rank = 0
        self.world = 1
        self.verdict: Verdict | None = None
        self.known_at: float | None = None
        self.seen = False
        self.reported = threading.Event()
        self.stage: list[str] = []


_PROCESS = _Process()


def _connect() -> Any:
    """This process's own connection to the rendezvous store (None: no process group of several ranks yet)."""
    with _PROCESS.lock:
        if _PROCESS.store is not None:
            return _PROCESS.store
        if "torch.distributed" not in sys.modules:  # never import torch here: the main thread may be importing it
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        from torch.distributed.distributed_c10d import _get_default_store

        _PROCESS.rank, _PROCESS.world = dist.get_rank(), dist.get_world_size()
        _PROCESS.store = cast(Any, _get_default_store()).clone()  # a new connection (torch's stubs lack it)
        return _PROCESS.store


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Run the block as the stage `name` ("in setup", "in generation and rewards at step 3"): an exception that ends
    it is announced, naming the stage, before it unwinds further."""
    _PROCESS.stage.append(name)
    try:
        yield
    except Exception as err:
        if _PROCESS.verdict is None:
            announce(classify(err), every_rank=_agreed_cause(err))
        raise
    finally:
        _PROCESS.stage.pop()


def _agreed_cause(err: BaseException) -> bool:
    """Whether `err` or an exception it was raised from is an `AgreedError`."""
    cause: BaseException | None = err
    for _ in range(10):
        if cause is None:
            return False
        if isinstance(cause, AgreedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def announce(failure: Failure, *, every_rank: bool = False) -> Verdict:
    """This rank's failure, offered as the verdict; returns the verdict: the first failure any rank announced (this
    one when it was first, or when no other rank can be reached). `every_rank`: every rank raised it alike after an
    agreement. Announcing twice returns the verdict known already."""
    if _PROCESS.verdict is not None:
        return _PROCESS.verdict
    where = _PROCESS.stage[-1] if _PROCESS.stage else None
    try:
        store = _connect()
    except Exception as err:  # no connection to the store: this rank's own failure is all it can report
        log.warning("could not reach the rendezvous store to announce the failure: %s", err)
        store = None
    own = Verdict(failure, -1 if every_rank else _PROCESS.rank, _PROCESS.world, where)
    verdict = own
    if store is not None:
        try:
            verdict = Verdict.from_json(store.compare_set(_KEY, "", own.to_json()))
        except Exception as err:  # the store is gone: this rank's own failure is all it can report
            log.warning("could not announce the failure to the other ranks: %s", err)
    _learn(verdict)
    return verdict


def _learn(verdict: Verdict) -> None:
    with _PROCESS.lock:
        if _PROCESS.verdict is None:
            _PROCESS.verdict, _PROCESS.known_at = verdict, time.monotonic()
        store, seen = _PROCESS.store, _PROCESS.seen
        _PROCESS.seen = True
    if store is not None and not seen:
        with contextlib.suppress(Exception):
            store.add(_SEEN_KEY, 1)


def report(verdict: Verdict) -> int:
    """Print the verdict and write it as the termination message (once per process), wait until every rank has seen
    it (at most `SEEN_WAIT_SECONDS`), and return its exit code."""
    with _PROCESS.lock:
        first = not _PROCESS.reported.is_set()
        _PROCESS.reported.set()
    failure = verdict.reported()
    if first:
        say_line(f"colocgrpo: {failure.reason}: {failure.message}", sys.stderr)
        write_termination_message(failure)
        _wait_until_seen()
    return failure.exit_code


def _wait_until_seen() -> None:
    store = _PROCESS.store
    if store is None:
        return
    deadline = time.monotonic() + SEEN_WAIT_SECONDS
    with contextlib.suppress(Exception):
        while store.add(_SEEN_KEY, 0) < _PROCESS.world and time.monotonic() < deadline:
            time.sleep(0.1)


class Watch:
    """The daemon thread that ends this process with another rank's verdict when the main thread cannot.

    `end(code)` ends the process (it must not return); the thread calls it after `report`. It connects once a
    process group of several ranks exists and polls the verdict every `POLL_SECONDS`.
    """

    def __init__(self, end: Callable[[int], Any]) -> None:
        self._end = end
        self._thread = threading.Thread(target=self._run, name="colocgrpo-verdict-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            verdict = _PROCESS.verdict or self._poll()
            if verdict is None:
                continue
            _learn(verdict)
            known_at = _PROCESS.known_at or time.monotonic()
            if _PROCESS.reported.wait(timeout=max(0.0, known_at + GRACE_SECONDS - time.monotonic())):
                return  # the main thread reports it and ends the process
            log.warning("the main thread did not stop within %.0f s of the verdict: ending the process", GRACE_SECONDS)
            self._end(report(verdict))
            return

    @staticmethod
    def _poll() -> Verdict | None:
        try:
            store = _connect()
            if store is None or not store.check([_KEY]):
                return None
            return Verdict.from_json(store.get(_KEY))
        except Exception:  # the store is restarting or gone; the next poll tries again
            return None


def rank_failed(exc: BaseException) -> int:
    """The entrypoint's handler: announce `exc` (unless a stage did) and report the verdict; its exit code."""
    return report(announce(classify(exc), every_rank=_agreed_cause(exc)))


__all__ = ["AgreedError", "Verdict", "Watch", "announce", "rank_failed", "report", "stage"]
