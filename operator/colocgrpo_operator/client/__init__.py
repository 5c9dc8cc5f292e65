"""A Python client of ColocGRPOJobs, for notebooks and pipelines: build a job from the typed model,
submit it, wait for a condition, follow its progress and logs, get, list, suspend, resume, delete.

    from colocgrpo_operator.client import ColocGRPOClient, ColocGRPOJob

    with ColocGRPOClient(namespace="team-a") as client:
        client.submit(job)
        for progress in client.progress(job.name):
            print(progress.step, progress.reward)

`ColocGRPOClient` (jobs.py) does the calls; `JobState`, `Progress` and `LogLine` (views.py) are what
they return; errors.py holds what they raise; logs.py reads a gang's logs. The `colocgrpo` command's
cluster verbs (get, describe, watch, logs, suspend, resume, delete) are this client. It is in the
`operator` extra: no torch, no official Kubernetes client (docs/python-client.md).
"""

from colocgrpo_operator.api import ColocGRPOJob, JobSpecError
from colocgrpo_operator.client.errors import (
    ClientError,
    JobDeleted,
    JobFailed,
    JobFinished,
    JobNotFound,
    NoPodForRank,
    WaitTimeout,
)
from colocgrpo_operator.client.jobs import ColocGRPOClient
from colocgrpo_operator.client.views import JobState, LogLine, Progress

__all__ = [
    "ClientError",
    "ColocGRPOClient",
    "ColocGRPOJob",
    "JobDeleted",
    "JobFailed",
    "JobFinished",
    "JobNotFound",
    "JobSpecError",
    "JobState",
    "LogLine",
    "NoPodForRank",
    "Progress",
    "WaitTimeout",
]
