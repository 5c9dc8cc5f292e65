"""What the client raises when a job is not there, has ended, or did not get where it was waited for.

Every error of the client's own is a `ClientError`, whose text is one line a person can act on (the
`colocgrpo` command prints it after `error:`). A refused request is the Kubernetes client's
`KubeApiError`, and credentials that cannot be used are a `CredentialsError`
(`colocgrpo_operator.kube`); neither is wrapped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colocgrpo_operator.client.views import JobState


class ClientError(Exception):
    """Base of the client's own errors; `str(error)` is one line."""


class JobNotFound(ClientError, LookupError):
    """No ColocGRPOJob of that name in that namespace."""

    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ColocGRPOJob {namespace}/{name} not found")


class JobDeleted(ClientError):
    """The job was deleted while the client watched it (`watch`, `wait`, `progress`)."""

    def __init__(self, namespace: str, name: str):
        self.namespace, self.name = namespace, name
        super().__init__(f"ColocGRPOJob {namespace}/{name} was deleted")


class JobFinished(ClientError):
    """The job has ended (Succeeded or Failed), so what was asked can no longer happen: suspending or
    resuming it, or waiting for a condition it never reached. `state` is the job as it ended."""

    def __init__(self, state: JobState, message: str):
        self.state = state
        super().__init__(message)


class JobFailed(JobFinished):
    """The job failed while `wait` waited for another condition; `state.last_failure` says why."""


class WaitTimeout(ClientError, TimeoutError):
    """`wait` gave up: the condition did not become True in time (or `delete` waited in vain for the job to
    go). `state` is the job as last seen."""

    def __init__(self, state: JobState, condition: str, timeout: float, message: str | None = None):
        self.state, self.condition, self.timeout = state, condition, timeout
        super().__init__(
            message
            or f"ColocGRPOJob {state.namespace}/{state.name}: {condition} is not True after {timeout:g} s "
            f"(phase {state.phase or 'none yet'})"
        )


class NoPodForRank(ClientError, LookupError):
    """The job has no pod of that rank (yet): `ranks` are those it has pods for."""

    def __init__(self, namespace: str, name: str, rank: int, ranks: list[int]):
        self.namespace, self.name, self.rank, self.ranks = namespace, name, rank, ranks
        hint = f"ranks with pods: {', '.join(map(str, ranks))}" if ranks else "the job has no pods yet"
        super().__init__(f"no pod of rank {rank} for job {namespace}/{name} ({hint})")
